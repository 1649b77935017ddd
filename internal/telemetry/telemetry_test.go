package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/outboxshop/outboxshop/internal/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// receiver is an OTLP/HTTP trace receiver: it decodes every ExportTraceServiceRequest
// posted to /v1/traces.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	services []string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.requests++
		for _, rs := range req.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					rc.services = append(rc.services, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				rc.spans = append(rc.spans, ss.GetSpans()...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) received() (requests int, spans []*tracepb.Span, services []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests, append([]*tracepb.Span(nil), rc.spans...), append([]string(nil), rc.services...)
}

// clearOTEL unsets every OTEL_* variable Env names, for the test.
func clearOTEL(t *testing.T) {
	for _, name := range []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED",
	} {
		t.Setenv(name, "")
	}
}

// TestOff: without an endpoint nothing is built, nothing is exported, and the global
// provider stays OpenTelemetry's no-op one (goleak in TestMain: no exporter goroutine).
func TestOff(t *testing.T) {
	clearOTEL(t)
	rc := newReceiver(t)
	global := otel.GetTracerProvider()

	for name, environ := range map[string]map[string]string{
		"NoEndpoint":   {"OTEL_SERVICE_NAME": "orders-test"},
		"SDKDisabled":  {"OTEL_EXPORTER_OTLP_ENDPOINT": rc.srv.URL, "OTEL_SDK_DISABLED": "true"},
		"ExporterNone": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rc.srv.URL + "/v1/traces", "OTEL_TRACES_EXPORTER": "none"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range environ {
				t.Setenv(k, v)
			}
			env, err := telemetry.LoadEnv(nil)
			require.NoError(t, err)
			require.False(t, env.Enabled())
			tel, err := telemetry.New(t.Context(), env, "orders")
			require.NoError(t, err)
			require.False(t, tel.Enabled())

			_, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "work")
			require.False(t, span.IsRecording(), "a no-op provider")
			require.False(t, span.SpanContext().IsValid())
			span.End()
			require.NoError(t, tel.Shutdown(t.Context()))

			// A no-op provider still carries a context it is given.
			parent := propagation.TraceContext{}.Extract(t.Context(), propagation.MapCarrier{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
			ctx, child := tel.TracerProvider().Tracer("test").Start(parent, "work")
			carrier := propagation.MapCarrier{}
			tel.Propagator().Inject(ctx, carrier)
			require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", carrier["traceparent"])
			child.End()

			require.Same(t, global, otel.GetTracerProvider(), "the global provider is never set")
			_, gspan := otel.Tracer("test").Start(t.Context(), "global")
			require.False(t, gspan.IsRecording(), "and stays a no-op")
			gspan.End()
		})
	}
	requests, _, _ := rc.received()
	require.Zero(t, requests, "nothing exported")
}

// TestExport: with an endpoint, spans reach an OTLP/HTTP receiver under the service's name
// (or OTEL_SERVICE_NAME), at the latest when Shutdown flushes them.
func TestExport(t *testing.T) {
	clearOTEL(t)
	rc := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // only Shutdown sends them
	global := otel.GetTracerProvider()

	env, err := telemetry.LoadEnv(nil)
	require.NoError(t, err)
	require.True(t, env.Enabled())
	tel, err := telemetry.New(t.Context(), env, "warehouse")
	require.NoError(t, err)
	require.True(t, tel.Enabled())
	require.IsType(t, (*sdktrace.TracerProvider)(nil), tel.TracerProvider())
	require.Same(t, global, otel.GetTracerProvider(), "the global provider is never set")

	ctx, parent := tel.TracerProvider().Tracer("test").Start(t.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	_, child := tel.TracerProvider().Tracer("test").Start(ctx, "INSERT orders")
	child.End()
	parent.End()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, tel.Shutdown(ctx))
	_, spans, services := rc.received()
	require.Len(t, spans, 2)
	require.Equal(t, []string{"warehouse"}, services)
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		byName[s.GetName()] = s
	}
	require.Equal(t, byName["POST /orders"].GetSpanId(), byName["INSERT orders"].GetParentSpanId())
	require.Equal(t, byName["POST /orders"].GetTraceId(), byName["INSERT orders"].GetTraceId())
	require.Equal(t, tracepb.Span_SPAN_KIND_SERVER, byName["POST /orders"].GetKind())

	t.Run("ServiceNameFromTheEnvironment", func(t *testing.T) {
		t.Setenv("OTEL_SERVICE_NAME", "warehouse-relay")
		tel, err := telemetry.New(t.Context(), env, "warehouse")
		require.NoError(t, err)
		_, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "publish")
		span.End()
		require.NoError(t, tel.Shutdown(t.Context()))
		_, _, services := rc.received()
		require.Equal(t, []string{"warehouse", "warehouse-relay"}, services)
	})
}

func TestEnvValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		env  telemetry.Env
		want string
	}{
		"OffIsNeverWrong":  {env: telemetry.Env{Protocol: "carrier-pigeon"}},
		"HTTP":             {env: telemetry.Env{Endpoint: "http://c:4318", Protocol: "http/protobuf"}},
		"GRPC":             {env: telemetry.Env{TracesEndpoint: "c:4317", TracesProtocol: "grpc", Protocol: "http/protobuf"}},
		"JSONIsNotServed":  {env: telemetry.Env{Endpoint: "http://c:4318", Protocol: "http/json"}, want: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		"TracesProtoWins":  {env: telemetry.Env{Endpoint: "http://c:4318", Protocol: "grpc", TracesProtocol: "udp"}, want: `is "udp"`},
		"UnknownExporter":  {env: telemetry.Env{Endpoint: "http://c:4318", TracesExporter: "zipkin"}, want: "OTEL_TRACES_EXPORTER"},
		"ExporterOTLPIsOK": {env: telemetry.Env{Endpoint: "http://c:4318", TracesExporter: "otlp"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.env.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			_, err = telemetry.New(t.Context(), tc.env, "orders")
			require.ErrorContains(t, err, tc.want)
		})
	}
}
