package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/logging"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// spans is what the shop's tracer providers exported, read back for the assertions.
type spans []tracetest.SpanStub

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func service(s tracetest.SpanStub) string {
	v, _ := s.Resource.Set().Value(semconv.ServiceNameKey)
	return v.AsString()
}

// find returns the spans for which match holds.
func (ss spans) find(match func(tracetest.SpanStub) bool) spans {
	var out spans
	for _, s := range ss {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one span for which match holds, failing the test otherwise.
func (ss spans) one(t *testing.T, what string, match func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	found := ss.find(match)
	require.Len(t, found, 1, "exactly one %s among:\n%s", what, ss)
	return found[0]
}

func (ss spans) inTrace(id trace.TraceID) spans {
	return ss.find(func(s tracetest.SpanStub) bool { return s.SpanContext.TraceID() == id })
}

func (ss spans) childrenOf(parent tracetest.SpanStub) spans {
	return ss.find(func(s tracetest.SpanStub) bool {
		return s.Parent.IsValid() && s.Parent.SpanID() == parent.SpanContext.SpanID()
	})
}

// String lists the spans in the order they started.
func (ss spans) String() string {
	sorted := slices.Clone(ss)
	slices.SortStableFunc(sorted, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	var b strings.Builder
	for _, s := range sorted {
		fmt.Fprintf(&b, "  %s %s %q kind=%s trace=%s span=%s parent=%s\n", s.StartTime.Format("15:04:05.000000"), service(s), s.Name,
			s.SpanKind, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID())
	}
	return b.String()
}

func isKind(kind trace.SpanKind, name string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return s.SpanKind == kind && s.Name == name }
}

// TestOrderTrace runs the shop with a tracer provider per service (an SDK provider exporting
// to memory, as cmd/ makes one exporting over OTLP) and proves from the exported spans that
// each order's saga is one trace, in causal order: the API's POST /orders server span → the
// orders relay's publish → the warehouse consumer's process → the warehouse relay's publish
// → the orders consumer's process, each a child of the one before, with the messaging
// attributes; and that a redelivered OrderCreated shows in that trace as a duplicate, with
// no second effect.
func TestOrderTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	provider := func(name string) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(name))))
		t.Cleanup(func() { require.NoError(t, tp.Shutdown(ctx)) }) // after the shop stopped
		return tp
	}
	global := otel.GetTracerProvider()
	// The warehouse logs as cmd/ sets it up (internal/logging): with the trace's ids.
	var logs lockedBuffer
	wlog := slog.New(logging.NewTraceHandler(slog.NewJSONHandler(&logs, nil)))
	s := startShopWith(t,
		ordersapp.Options{TracerProvider: provider("orders")},
		warehouseapp.Options{TracerProvider: provider("warehouse"), Logger: wlog})

	code, _, _, err := call(http.MethodPut, s.stockURL+"/stock/BOOK-1", "", map[string]int64{"available": 100})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	const orders = 3
	ids := make([]string, orders)
	for i := range ids {
		code, _, got, err := call(http.MethodPost, s.ordersURL+"/orders", fmt.Sprintf("%s-%d", t.Name(), i),
			orderRequest{CustomerID: "c-trace", Items: []orderLine{{SKU: "BOOK-1", Quantity: 1}}})
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, code)
		ids[i] = got.ID
	}

	// A span is exported when it ends, and a publish span ends when the relay committed the
	// outcome, which may be after the next hop's process span ended: wait for every hop's
	// span of every order.
	publish := "publish " + s.exchange
	warehouseProcess, ordersProcess := "process "+s.warehouseQueue, "process "+s.ordersQueue
	published := func(typ string) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool {
			return s.Name == publish && attr(s, "outbox.message.type").AsString() == typ
		}
	}
	testinfra.Eventually(t, 60*time.Second, func() bool {
		got := spans(exp.GetSpans())
		for _, hop := range []func(tracetest.SpanStub) bool{
			isKind(trace.SpanKindServer, "POST /orders"), published("OrderCreated"),
			isKind(trace.SpanKindConsumer, warehouseProcess), published("StockReserved"),
			isKind(trace.SpanKindConsumer, ordersProcess),
		} {
			if len(got.find(hop)) < orders {
				return false
			}
		}
		return true
	}, "the spans of %d sagas", orders)
	all := spans(exp.GetSpans())

	sagas := map[string]tracetest.SpanStub{} // order id → its OrderCreated publish span
	for _, id := range ids {
		t.Run("Order"+id, func(t *testing.T) {
			// The orders relay's publish of OrderCreated names the order: its trace is the saga's.
			p1 := all.one(t, "OrderCreated publish", func(s tracetest.SpanStub) bool {
				return published("OrderCreated")(s) && attr(s, "outbox.aggregate.id").AsString() == id
			})
			sagas[id] = p1
			tr := all.inTrace(p1.SpanContext.TraceID())

			server := tr.one(t, "POST /orders server span", isKind(trace.SpanKindServer, "POST /orders"))
			c1 := tr.one(t, "warehouse process span", isKind(trace.SpanKindConsumer, warehouseProcess))
			p2 := tr.one(t, "StockReserved publish", published("StockReserved"))
			c2 := tr.one(t, "orders process span", isKind(trace.SpanKindConsumer, ordersProcess))
			t.Logf("the trace of order %s:\n%s", id, tr)

			// One trace, each hop the child of the one before.
			require.False(t, server.Parent.IsValid(), "the request carried no traceparent: the server span is the root")
			chain := []tracetest.SpanStub{server, p1, c1, p2, c2}
			for i := 1; i < len(chain); i++ {
				require.Equal(t, chain[i-1].SpanContext.SpanID(), chain[i].Parent.SpanID(),
					"%q is a child of %q:\n%s", chain[i].Name, chain[i-1].Name, tr)
				require.False(t, chain[i].StartTime.Before(chain[i-1].StartTime), "%q starts after %q", chain[i].Name, chain[i-1].Name)
				require.Empty(t, chain[i].Links, "the parent is the only relation")
			}
			require.Equal(t, []string{"orders", "orders", "warehouse", "warehouse", "orders"},
				[]string{service(server), service(p1), service(c1), service(p2), service(c2)})

			// HTTP: the route pattern.
			require.Equal(t, "/orders", attr(server, "http.route").AsString())
			require.EqualValues(t, http.StatusCreated, attr(server, "http.response.status_code").AsInt64())

			// Messaging: each publish and the process of its message.
			for _, hop := range []struct {
				pub, proc       tracetest.SpanStub
				key, queue, typ string
			}{
				{p1, c1, "order.created", s.warehouseQueue, "OrderCreated"},
				{p2, c2, "stock.reserved", s.ordersQueue, "StockReserved"},
			} {
				require.Equal(t, trace.SpanKindProducer, hop.pub.SpanKind)
				for _, sp := range []tracetest.SpanStub{hop.pub, hop.proc} {
					require.Equal(t, "rabbitmq", attr(sp, "messaging.system").AsString())
					require.Equal(t, s.exchange, attr(sp, "messaging.destination.name").AsString())
					require.Equal(t, hop.key, attr(sp, "messaging.rabbitmq.destination.routing_key").AsString())
				}
				require.Equal(t, "send", attr(hop.pub, "messaging.operation.type").AsString())
				require.Equal(t, "published", attr(hop.pub, "outbox.outcome").AsString())
				require.Equal(t, "process", attr(hop.proc, "messaging.operation.type").AsString())
				require.Equal(t, hop.queue, attr(hop.proc, "messaging.destination.subscription.name").AsString())
				require.Equal(t, hop.typ, attr(hop.proc, "inbox.message.type").AsString())
				require.Equal(t, "processed", attr(hop.proc, "inbox.outcome").AsString())
				require.NotEmpty(t, attr(hop.pub, "messaging.message.id").AsString())
				require.Equal(t, attr(hop.pub, "messaging.message.id").AsString(), attr(hop.proc, "messaging.message.id").AsString(),
					"the process span handles the message the publish span sent")
			}

			// The database work shows under the request and under the warehouse's handling.
			for _, parent := range []tracetest.SpanStub{server, c1} {
				db := tr.childrenOf(parent).find(func(s tracetest.SpanStub) bool {
					return s.SpanKind == trace.SpanKindClient && attr(s, "db.system.name").AsString() == "postgresql"
				})
				require.NotEmpty(t, db, "query spans under %q:\n%s", parent.Name, tr)
			}
			insert := tr.childrenOf(server).find(func(s tracetest.SpanStub) bool { return s.Name == "INSERT orders" })
			require.Len(t, insert, 1, "the order's INSERT under the request:\n%s", tr)

			// The warehouse's log line about the order names the process span.
			var handled map[string]any
			for l := range strings.Lines(logs.String()) {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(l), &m))
				if m["msg"] == "order handled" && m["order_id"] == id {
					handled = m
				}
			}
			require.NotNil(t, handled, "the warehouse logged the order")
			require.Equal(t, c1.SpanContext.TraceID().String(), handled["trace_id"])
			require.Equal(t, c1.SpanContext.SpanID().String(), handled["span_id"])
		})
	}

	t.Run("RedeliveredDuplicate", func(t *testing.T) {
		// The broker delivers the first order's OrderCreated again, as it would after a lost
		// acknowledgement: the same message id, the headers the relay's publish sent.
		id := ids[0]
		p1 := sagas[id]
		require.NotZero(t, p1.SpanContext.TraceID(), "the order's saga was found")
		msgID := attr(p1, "messaging.message.id").AsString()
		var payload []byte
		var correlation string
		require.NoError(t, s.orders.QueryRow(ctx,
			`SELECT payload::text, headers->>'correlation_id' FROM outbox_messages WHERE id = $1`, msgID).Scan(&payload, &correlation))
		headers := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(ctx, p1.SpanContext), headers)
		table := amqp.Table{"correlation_id": correlation}
		for k, v := range headers {
			table[k] = v
		}
		conn, err := amqp.Dial(testinfra.AMQPURL(t))
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.PublishWithContext(ctx, "", s.warehouseQueue, true, false, amqp.Publishing{
			MessageId: msgID, Type: "OrderCreated", ContentType: "application/json", CorrelationId: correlation,
			DeliveryMode: amqp.Persistent, Headers: table, Body: payload,
		}))

		var dup tracetest.SpanStub
		testinfra.Eventually(t, 30*time.Second, func() bool {
			found := spans(exp.GetSpans()).find(func(s tracetest.SpanStub) bool {
				return s.Name == warehouseProcess && attr(s, "inbox.duplicate").AsBool()
			})
			if len(found) == 1 {
				dup = found[0]
			}
			return len(found) > 0
		}, "the duplicate's process span")
		require.Equal(t, p1.SpanContext.TraceID(), dup.SpanContext.TraceID(), "in the order's trace")
		require.Equal(t, p1.SpanContext.SpanID(), dup.Parent.SpanID(), "a child of the publish that sent it")
		require.Equal(t, "duplicate", attr(dup, "inbox.outcome").AsString())
		require.Equal(t, msgID, attr(dup, "messaging.message.id").AsString())

		// No second effect: nothing under the duplicate but the inbox's own queries, and
		// still one answer and one reservation for the order.
		tr := spans(exp.GetSpans()).inTrace(p1.SpanContext.TraceID())
		for _, c := range tr.childrenOf(dup) {
			require.Equal(t, "postgresql", attr(c, "db.system.name").AsString(), "only the inbox's queries under a duplicate, not %q", c.Name)
		}
		require.Len(t, tr.find(func(s tracetest.SpanStub) bool {
			return s.SpanKind == trace.SpanKindProducer && attr(s, "outbox.message.type").AsString() == "StockReserved"
		}), 1, "one StockReserved publish in the trace:\n%s", tr)
		var answers, reservations int
		require.NoError(t, s.warehouse.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE aggregate_id = $1`, id).Scan(&answers))
		require.NoError(t, s.warehouse.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = $1`, id).Scan(&reservations))
		require.Equal(t, 1, answers, "one answer to the order")
		require.Equal(t, 1, reservations, "one reservation")
	})

	require.Same(t, global, otel.GetTracerProvider(), "the services never set the global provider")
	require.False(t, slices.ContainsFunc(all, func(s tracetest.SpanStub) bool {
		return strings.HasPrefix(s.Name, "GET /readyz") || s.Name == "GET /metrics" || s.Name == "GET /healthz"
	}), "no spans for the operations routes")
}
