// Package e2e_test runs the whole shop in one test process — both services with their HTTP
// APIs, consumers and relays, on real listeners — against real PostgreSQL and RabbitMQ, and
// proves the saga's invariants from the databases.
package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/e2e/verify"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// adminTokenFile is the development admin token of make run and compose, which the README's
// walk sends: every shop of the tests runs with it, and call sends it with every PUT.
const adminTokenFile = "../deploy/compose/warehouse-admin-token"

// adminToken is the content of adminTokenFile.
var adminToken = func() string {
	b, err := os.ReadFile(adminTokenFile)
	if err != nil {
		panic(err)
	}
	return strings.TrimRight(string(b), "\r\n")
}()

// shop is both services running in-process, with the test's own databases and topology.
type shop struct {
	orders, warehouse   *pgxpool.Pool
	ordersURL, stockURL string
	ordersApp           *ordersapp.App
	warehouseApp        *warehouseapp.App
	// exchange and the queues are the test's own topology.
	exchange                    string
	ordersQueue, warehouseQueue string
}

func startShop(t *testing.T) *shop {
	t.Helper()
	return startShopWith(t, ordersapp.Options{}, warehouseapp.Options{})
}

// startShopWith starts the shop with the services' options (a tracer provider, say).
func startShopWith(t *testing.T, oopts ordersapp.Options, wopts warehouseapp.Options) *shop {
	t.Helper()
	ctx := context.Background()
	amqpURL := testinfra.AMQPURL(t)
	exchange, dlx := testinfra.UniqueName(t, "events"), testinfra.UniqueName(t, "dlx")

	wcfg := warehouseapp.DefaultConfig()
	wcfg.DatabaseURL, wcfg.AMQPURL = testinfra.DatabaseURL(t), amqpURL
	wcfg.HTTPAddr, wcfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	wcfg.EventsExchange, wcfg.DeadLetterExchange = exchange, dlx
	wcfg.Queue, wcfg.DeadLetterQueue = testinfra.UniqueName(t, "warehouse"), testinfra.UniqueName(t, "warehouse_dead")
	wcfg.RelayPollInterval = 100 * time.Millisecond
	wcfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	wcfg.AdminTokenFile = adminTokenFile

	ocfg := ordersapp.DefaultConfig()
	ocfg.DatabaseURL, ocfg.AMQPURL = testinfra.DatabaseURL(t), amqpURL
	ocfg.HTTPAddr, ocfg.RelayHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	ocfg.EventsExchange, ocfg.DeadLetterExchange = exchange, dlx
	ocfg.Queue, ocfg.DeadLetterQueue = testinfra.UniqueName(t, "orders"), testinfra.UniqueName(t, "orders_dead")
	ocfg.RelayPollInterval = 100 * time.Millisecond
	ocfg.ConsumerRetryBaseDelay = 50 * time.Millisecond
	t.Cleanup(func() {
		deleteTopology(t, amqpURL, []string{exchange, dlx}, wcfg.Queue, wcfg.DeadLetterQueue, ocfg.Queue, ocfg.DeadLetterQueue)
	})

	s := &shop{exchange: exchange, ordersQueue: ocfg.Queue, warehouseQueue: wcfg.Queue}
	var err error
	// Each service declares the queue it consumes: both must be up before events flow, or
	// the first events would be unroutable.
	s.warehouseApp, err = warehouseapp.New(wcfg, warehouseapp.ModeAll, wopts)
	require.NoError(t, err)
	require.NoError(t, s.warehouseApp.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.warehouseApp.Stop()) })
	s.ordersApp, err = ordersapp.New(ocfg, ordersapp.ModeAll, oopts)
	require.NoError(t, err)
	require.NoError(t, s.ordersApp.Start(ctx))
	t.Cleanup(func() { require.NoError(t, s.ordersApp.Stop()) })
	testinfra.Eventually(t, 30*time.Second, s.warehouseApp.Consuming, "warehouse consuming")

	s.ordersURL, s.stockURL = s.ordersApp.URL(), "http://"+s.warehouseApp.HTTPAddr()
	s.orders, s.warehouse = s.ordersApp.Pool(), s.warehouseApp.Pool()
	return s
}

type orderLine struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

type orderRequest struct {
	CustomerID string      `json:"customer_id"`
	Items      []orderLine `json:"items"`
}

type orderResponse struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// call sends a JSON request and returns the status, whether the answer was a replay
// (Idempotent-Replayed) and the decoded body. It is safe to use from any goroutine.
func call(method, url, key string, body any) (int, bool, orderResponse, error) {
	var buf bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&buf).Encode(body); err != nil {
			return 0, false, orderResponse{}, err
		}
	}
	req, err := http.NewRequest(method, url, &buf)
	if err != nil {
		return 0, false, orderResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if method == http.MethodPut {
		// A restock before the load sets the level whatever it is: PUT /stock/{sku} needs a
		// precondition, and * is the one that says so.
		req.Header.Set("If-Match", "*")
		// PUT /stock/{sku} is the warehouse's admin route.
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, orderResponse{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, orderResponse{}, err
	}
	var out orderResponse
	_ = json.Unmarshal(raw, &out) // problem documents have no id; the status code says it
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", out, nil
}

// TestShopEndToEnd places 300 orders concurrently against limited stock — some retried with
// their Idempotency-Key, some cancelled while the saga runs — and proves from both databases
// that every order ended in a final status, the warehouse applied each exactly once, stock
// adds up and never went negative, and both outboxes drained.
func TestShopEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startShop(t)

	// Limited stock, so that many orders are rejected.
	initial := map[string]int64{"BOOK-1": 60, "MUG-1": 40, "TEE-1": 25, "PEN-1": 90, "BAG-1": 8}
	for sku, n := range initial {
		code, _, _, err := call(http.MethodPut, s.stockURL+"/stock/"+sku, "", map[string]int64{"available": n})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "restock %s", sku)
	}
	skus := []string{"BOOK-1", "MUG-1", "TEE-1", "PEN-1", "BAG-1"}

	const orders, workers = 300, 16
	var (
		mu        sync.Mutex
		acked     = map[string]string{} // Idempotency-Key → order id
		retried   int
		cancelled int
		wg        sync.WaitGroup
		next      = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				rng := rand.New(rand.NewPCG(uint64(i), 42))
				req := orderRequest{CustomerID: fmt.Sprintf("customer-%d", i%37)}
				for _, j := range rng.Perm(len(skus))[:1+rng.IntN(3)] {
					req.Items = append(req.Items, orderLine{SKU: skus[j], Quantity: 1 + rng.IntN(3)})
				}
				key := fmt.Sprintf("%s-order-%d", t.Name(), i)
				code, replayed, got, err := call(http.MethodPost, s.ordersURL+"/orders", key, req)
				if !assert.NoError(t, err) || !assert.Equal(t, http.StatusCreated, code, "order %d", i) {
					continue
				}
				assert.False(t, replayed)
				assert.Equal(t, "PENDING", got.Status)
				if i%5 == 0 { // a client whose answer was lost retries with its key
					code, replayed, again, err := call(http.MethodPost, s.ordersURL+"/orders", key, req)
					assert.NoError(t, err)
					assert.Equal(t, http.StatusCreated, code)
					assert.True(t, replayed, "a retry is a replay")
					assert.Equal(t, got.ID, again.ID, "a retry creates nothing new")
					mu.Lock()
					retried++
					mu.Unlock()
				}
				if i%7 == 0 { // cancelled while the warehouse may still be deciding
					code, _, _, err := call(http.MethodPost, s.ordersURL+"/orders/"+got.ID+"/cancel", "", nil)
					assert.NoError(t, err)
					// 409: the warehouse rejected the order first.
					assert.Contains(t, []int{http.StatusOK, http.StatusConflict}, code, "cancel %s", got.ID)
					if code == http.StatusOK {
						mu.Lock()
						cancelled++
						mu.Unlock()
					}
				}
				mu.Lock()
				acked[key] = got.ID
				mu.Unlock()
			}
		})
	}
	for i := range orders {
		next <- i
	}
	close(next)
	wg.Wait()
	require.Len(t, acked, orders)
	t.Logf("placed %d orders, %d retried with their key, %d cancelled", orders, retried, cancelled)

	want := verify.Expectation{Acknowledged: acked, InitialStock: initial}
	report := waitForInvariants(t, s, want, 90*time.Second)
	t.Logf("final statuses: %v", report.ByStatus)
	require.Equal(t, orders, report.Orders, "one order per key")
	require.Positive(t, report.ByStatus["RESERVED"], "some orders reserved")
	require.Positive(t, report.ByStatus["REJECTED"], "limited stock rejected some orders")
	require.Positive(t, report.ByStatus["CANCELLED"], "cancellations went through")

	// The API tells the same story as the database.
	for _, i := range []int{0, 1, 7} {
		id := acked[fmt.Sprintf("%s-order-%d", t.Name(), i)]
		code, _, got, err := call(http.MethodGet, s.ordersURL+"/orders/"+id, "", nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		var st string
		require.NoError(t, s.orders.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", id).Scan(&st))
		require.Equal(t, st, got.Status)
	}

	t.Run("VerifierIsNotVacuous", func(t *testing.T) {
		// Break the databases the way a bug would, and see the verifier say so. (A second
		// reserve movement for one order cannot even be written: a unique index forbids it.)
		// Two different orders: one stuck, another whose reservation is released.
		stuck := acked[fmt.Sprintf("TestShopEndToEnd-order-%d", 3)]
		var reserved string
		require.NoError(t, s.warehouse.QueryRow(ctx, `SELECT order_id::text FROM reservations WHERE status = 'RESERVED' AND order_id <> $1 LIMIT 1`, stuck).Scan(&reserved))
		_, err := s.warehouse.Exec(ctx, `UPDATE reservations SET status = 'RELEASED' WHERE order_id = $1`, reserved) // released without giving stock back
		require.NoError(t, err)
		_, err = s.orders.Exec(ctx, `UPDATE orders SET status = 'PENDING' WHERE id = $1`, stuck)
		require.NoError(t, err)
		report, err := verify.Run(ctx, s.orders, s.warehouse, want)
		require.NoError(t, err)
		require.False(t, report.OK())
		require.Len(t, report.Stuck, 1)
		problems := strings.Join(report.Problems, "\n")
		require.Contains(t, problems, "is RESERVED but its reservation is \"RELEASED\"")
		require.Contains(t, problems, "but its movements hold")
		require.Contains(t, problems, "initial")
		require.Contains(t, problems, "did not reach a final status")
	})
}

// waitForInvariants polls the verifier until every invariant holds or the deadline passes,
// and then fails the test with the broken ones.
func waitForInvariants(t *testing.T, s *shop, want verify.Expectation, timeout time.Duration) verify.Report {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		report, err := verify.Run(ctx, s.orders, s.warehouse, want)
		require.NoError(t, err)
		if report.OK() {
			return report
		}
		if time.Now().After(deadline) {
			t.Fatalf("invariants still broken after %s (statuses %v):\n%s", timeout, report.ByStatus, strings.Join(report.Problems, "\n"))
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func deleteTopology(t *testing.T, url string, exchanges []string, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, q := range queues {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	for _, ex := range exchanges {
		require.NoError(t, ch.ExchangeDelete(ex, false, false))
	}
}
