package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/logging"
)

func TestTraceIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New(&buf, "json", "info", "orders")
	require.NoError(t, err)
	log = log.With("mode", "api").WithGroup("req")

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "with a span", "id", 1)
	log.InfoContext(context.Background(), "without a span", "id", 2)
	log.Info("without a context", "id", 3)

	var lines []map[string]any
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var m map[string]any
		require.NoError(t, dec.Decode(&m))
		lines = append(lines, m)
	}
	require.Len(t, lines, 3)
	require.Equal(t, "orders", lines[0]["service"])
	require.Equal(t, "api", lines[0]["mode"])
	require.Equal(t, map[string]any{
		"id": float64(1), "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
	}, lines[0]["req"], "inside the group the record's attributes are in")
	for _, l := range lines[1:] {
		require.NotContains(t, l["req"], "trace_id")
		require.NotContains(t, l, "trace_id")
	}
}

// lastDown is a slog.LogValuer that resolves to a duration, as a type of a caller might.
type lastDown time.Duration

func (d lastDown) LogValue() slog.Value { return slog.DurationValue(time.Duration(d)) }

func TestDurations(t *testing.T) {
	t.Parallel()

	// logLine logs one line with durations in every way a caller passes them: an attribute
	// of the record, of the logger (With), inside a group, through slog.Any and through a
	// LogValuer, next to a number that is no duration.
	logLine := func(t *testing.T, format string) *bytes.Buffer {
		t.Helper()
		var buf bytes.Buffer
		log, err := logging.New(&buf, format, "info", "warehouse")
		require.NoError(t, err)
		log.With(slog.Duration("shutdown_timeout", 20*time.Second)).Info("database ready",
			slog.Duration("waited", 13*time.Millisecond),
			slog.Any("backoff", 1500*time.Millisecond),
			slog.Group("streak", slog.Duration("down_for", 90*time.Second), slog.Int("attempts", 3)),
			slog.Any("last_down", lastDown(0)),
		)
		return &buf
	}

	t.Run("JSONWritesTheirString", func(t *testing.T) {
		t.Parallel()
		var line map[string]any
		require.NoError(t, json.Unmarshal(logLine(t, "json").Bytes(), &line))
		require.Equal(t, "13ms", line["waited"], "not a number of nanoseconds")
		require.Equal(t, "1.5s", line["backoff"])
		require.Equal(t, "20s", line["shutdown_timeout"], "an attribute of the logger")
		require.Equal(t, map[string]any{"down_for": "1m30s", "attempts": float64(3)}, line["streak"],
			"inside a group; a number stays a number")
		require.Equal(t, "0s", line["last_down"], "a LogValuer's duration")
	})

	t.Run("TextWritesTheSame", func(t *testing.T) {
		t.Parallel()
		line := logLine(t, "text").String()
		for _, want := range []string{
			" shutdown_timeout=20s ", " waited=13ms ", " backoff=1.5s ", " streak.down_for=1m30s ", " streak.attempts=3 ", " last_down=0s\n",
		} {
			require.Contains(t, line, want)
		}
	})
}
