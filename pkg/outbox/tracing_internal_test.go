package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkPublishSpans measures the spans of one relay batch of 100 rows alone (no
// database, no broker): start, the sent event, outcomes, end. Reported per row. "off" is the
// relay's default, the global provider with no SDK installed.
func BenchmarkPublishSpans(b *testing.B) {
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	const batch = 100
	msgs := make([]Message, batch)
	for i := range msgs {
		msgs[i] = Message{ID: uuid.New(), Exchange: "orders", RoutingKey: "order.created", Type: "OrderCreated",
			AggregateType: "order", AggregateID: fmt.Sprint(i), Payload: []byte(`{}`), CreatedAt: time.Now(),
			Headers: map[string]string{HeaderTraceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	}
	for _, mode := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil},
		{"noop", noop.NewTracerProvider()},
		{"recording", sdktrace.NewTracerProvider()},
	} {
		b.Run(mode.name, func(b *testing.B) {
			cfg, err := Config{TracerProvider: mode.tp, Propagator: w3c, MessagingSystem: "rabbitmq"}.WithDefaults()
			if err != nil {
				b.Fatal(err)
			}
			r := &Relay{cfg: cfg, tracer: cfg.TracerProvider.Tracer(TracerName)}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				bs := r.startSpans(ctx, msgs, now)
				for i := range msgs {
					_ = bs.sendHeaders(i, msgs[i])
				}
				bs.sent(now)
				for i := range msgs {
					bs.outcome(i, "published", nil)
				}
				bs.end(now, nil)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/row")
		})
	}
}
