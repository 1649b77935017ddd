package inboxrabbitmqmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/inboxrabbitmqmetrics"
)

// sampled is the context of a sampled span.
var sampled = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

func TestHandlerDurationExemplars(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*prometheus.Registry, inboxrabbitmq.Hooks) {
		reg := prometheus.NewPedanticRegistry()
		m, err := inboxrabbitmqmetrics.NewConsumer(reg, inboxrabbitmqmetrics.Config{KnownTypes: []string{"OrderCreated"}})
		require.NoError(t, err)
		m.Init("warehouse")
		return reg, m.Hooks(inboxrabbitmq.Hooks{})
	}
	processed := func(sc trace.SpanContext) inboxrabbitmq.ProcessedMessage {
		return inboxrabbitmq.ProcessedMessage{Consumer: "warehouse", Type: "OrderCreated", Duration: 20 * time.Millisecond, SpanContext: sc}
	}

	t.Run("a delivery handled under a sampled span carries its trace and span ids", func(t *testing.T) {
		t.Parallel()
		reg, hooks := setup(t)
		hooks.Processed(processed(sampled))
		hooks.Processed(processed(trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})))

		ex := exemplars(t, reg, "inbox_handler_duration_seconds")
		require.Len(t, ex, 1, "only the sampled span's observation")
		require.Equal(t, map[string]string{
			inboxrabbitmqmetrics.ExemplarTraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
			inboxrabbitmqmetrics.ExemplarSpanID:  "00f067aa0ba902b7",
		}, exemplarLabels(ex[0]))
		require.InDelta(t, 0.02, ex[0].GetValue(), 1e-9)
	})

	t.Run("without a span no exemplar", func(t *testing.T) {
		t.Parallel()
		reg, hooks := setup(t)
		hooks.Processed(processed(trace.SpanContext{}))
		require.Empty(t, exemplars(t, reg, "inbox_handler_duration_seconds"))
	})
}

// TestHandlerDurationExemplarsAllocations: without tracing, the Processed hook allocates
// nothing (testing.AllocsPerRun refuses to run in parallel tests).
func TestHandlerDurationExemplarsAllocations(t *testing.T) {
	m, err := inboxrabbitmqmetrics.NewConsumer(prometheus.NewRegistry(), inboxrabbitmqmetrics.Config{KnownTypes: []string{"OrderCreated"}})
	require.NoError(t, err)
	m.Init("warehouse")
	hooks := m.Hooks(inboxrabbitmq.Hooks{})
	e := inboxrabbitmq.ProcessedMessage{Consumer: "warehouse", Type: "OrderCreated", Duration: time.Millisecond}
	require.Zero(t, testing.AllocsPerRun(100, func() { hooks.Processed(e) }))
}

// exemplars returns the exemplars of the histogram name's buckets.
func exemplars(t *testing.T, g prometheus.Gatherer, name string) []*dto.Exemplar {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var out []*dto.Exemplar
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if e := b.GetExemplar(); e != nil {
					out = append(out, e)
				}
			}
		}
		return out
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func exemplarLabels(e *dto.Exemplar) map[string]string {
	m := map[string]string{}
	for _, l := range e.GetLabel() {
		m[l.GetName()] = l.GetValue()
	}
	return m
}
