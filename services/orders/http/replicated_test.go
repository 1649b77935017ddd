package http_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordershttp "github.com/outboxshop/outboxshop/services/orders/http"
	"github.com/outboxshop/outboxshop/services/orders/postgres"
)

// pairTimeout is the API's database timeout on the pair: how long a request waits for the
// synchronous standby before it answers 503.
const pairTimeout = time.Second

// setupOnPair is setup on a private primary with a synchronous standby, the API reaching it
// through the pair's multi-host URL, as a service configured for a failover does. Its
// sessions run with synchronous_commit=local, as an operator may set it (for a role, a
// database, or the URL) to make commits faster: a plain COMMIT then returns before the
// standby has it, so the API must not rely on the server's setting.
func setupOnPair(t *testing.T) (*bundle, *testinfra.PostgresPair) {
	t.Helper()
	ctx := context.Background()
	pair := testinfra.StartPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "orders")
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = pairTimeout
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "local"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	pair.WaitReplayed(t)
	store, err := postgres.NewStore(pool, postgres.StoreConfig{Exchange: "test.events"})
	require.NoError(t, err)
	b := &bundle{pool: pool, store: store, logs: &logBuffer{}, commits: &counter{}, reg: prometheus.NewPedanticRegistry()}
	b.srv = httptest.NewServer(ordershttp.NewHandler(ordershttp.Config{
		Orders:          store,
		Logger:          slog.New(slog.NewJSONHandler(b.logs, nil)),
		AfterCommit:     b.commits.inc,
		DatabaseTimeout: pairTimeout,
	}))
	t.Cleanup(b.srv.Close)
	return b, pair
}

// primaryOrder returns the order id stored with an idempotency key on the primary itself,
// or "" when the key is not there.
func primaryOrder(t *testing.T, pair *testinfra.PostgresPair, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pair.Primary.URL("orders"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var id string
	err = conn.QueryRow(ctx, `SELECT order_id::text FROM idempotency_keys WHERE key = $1`, key).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return id
}

// TestAcknowledgesOnlyWhatIsReplicated: with a synchronous standby, the API answers 201 or
// 200 only for what the standby has (issue 24). An order committed on the primary alone —
// its request answered 503 when the wait for the standby outlived the request, then made
// visible by the primary's crash and restart, which replays its WAL — is neither replayed
// nor read while the standby is away: 503, and the client retries. Once the standby is
// back the retry is replayed; after a failover instead the order is gone, and the service
// never said it existed.
func TestAcknowledgesOnlyWhatIsReplicated(t *testing.T) {
	t.Parallel()
	b, pair := setupOnPair(t)

	// localOnly posts an order with key while the standby is down (503: the commit's wait
	// for the standby outlived the request, despite synchronous_commit=local), and restarts
	// the primary, which replays the commit: the order is then on the primary alone. It
	// returns the order's path.
	localOnly := func(t *testing.T, key string) string {
		t.Helper()
		pair.KillStandby(t)
		resp := b.post(t, validBody, "Idempotency-Key: "+key)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode,
			"a create whose commit the standby has not confirmed is not acknowledged; body: %s", resp.body)
		pair.RestartPrimary(t)
		id := primaryOrder(t, pair, key)
		require.NotEmpty(t, id, "the restarted primary replayed the commit")
		return "/orders/" + id
	}
	// unconfirmed requires that neither a retry of key nor a read of path is answered
	// while the standby is down.
	unconfirmed := func(t *testing.T, key, path string) {
		t.Helper()
		retry := b.post(t, validBody, "Idempotency-Key: "+key)
		assert.Equal(t, http.StatusServiceUnavailable, retry.StatusCode,
			"a replay of an order on the primary alone is not acknowledged; body: %s", retry.body)
		assert.Empty(t, retry.Header.Get(ordershttp.HeaderIdempotentReplayed))
		get := b.do(t, http.MethodGet, path, "")
		assert.Equal(t, http.StatusServiceUnavailable, get.StatusCode,
			"an order on the primary alone is not answered; body: %s", get.body)
		if t.Failed() {
			t.FailNow()
		}
	}

	t.Run("ReplayedOnceTheStandbyHasIt", func(t *testing.T) {
		path := localOnly(t, "replay-1")
		unconfirmed(t, "replay-1", path)

		pair.StartStandby(t)
		var retry response
		testinfra.Eventually(t, 30*time.Second, func() bool {
			retry = b.post(t, validBody, "Idempotency-Key: replay-1")
			return retry.StatusCode != http.StatusServiceUnavailable
		}, "the retry is answered once the standby is back")
		require.Equal(t, http.StatusCreated, retry.StatusCode, "body: %s", retry.body)
		require.Equal(t, "true", retry.Header.Get(ordershttp.HeaderIdempotentReplayed))
		require.Equal(t, path, retry.Header.Get("Location"))
		get := b.do(t, http.MethodGet, path, "")
		require.Equal(t, http.StatusOK, get.StatusCode, "body: %s", get.body)
		require.Equal(t, 0, b.commits.get(), "no request created an order it acknowledged")
	})

	t.Run("LostInAFailoverNeverAcknowledged", func(t *testing.T) {
		path := localOnly(t, "lost-1")
		unconfirmed(t, "lost-1", path)

		pair.KillPrimary(t)
		pair.StartStandby(t)
		pair.Promote(t)
		var get response
		testinfra.Eventually(t, 30*time.Second, func() bool {
			get = b.do(t, http.MethodGet, path, "")
			return get.StatusCode != http.StatusServiceUnavailable
		}, "the API reaches the promoted standby")
		require.Equal(t, http.StatusNotFound, get.StatusCode, "the order was on the old primary alone; body: %s", get.body)

		// The client, never told of the order, retries: the key was lost with it, so the
		// order is created once, on the new primary.
		retry := b.post(t, validBody, "Idempotency-Key: lost-1")
		require.Equal(t, http.StatusCreated, retry.StatusCode, "body: %s", retry.body)
		require.Empty(t, retry.Header.Get(ordershttp.HeaderIdempotentReplayed))
		require.NotEqual(t, path, retry.Header.Get("Location"))
		require.Equal(t, 1, b.commits.get())
	})
}
