package alertlog_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/tools/alertlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A notification as Alertmanager 0.28 sends it to the page receiver: one alert firing, one
// resolved.
const notification = `{
  "receiver": "page", "status": "firing", "version": "4", "truncatedAlerts": 0,
  "groupKey": "{}/{severity=\"page\"}:{alertname=\"OutboxRelayStalled\", job=\"orders-relay\"}",
  "groupLabels": {"alertname": "OutboxRelayStalled", "job": "orders-relay"},
  "commonLabels": {"alertname": "OutboxRelayStalled", "severity": "page"},
  "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
  "alerts": [
    {"status": "firing", "fingerprint": "a1b2", "startsAt": "2026-11-29T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
     "generatorURL": "http://prometheus:9090/graph",
     "labels": {"alertname": "OutboxRelayStalled", "severity": "page", "job": "orders-relay", "service": "orders"},
     "annotations": {"summary": "The orders outbox relay publishes nothing", "runbook_url": "docs/runbook.md#outboxrelaystalled"}},
    {"status": "resolved", "fingerprint": "c3d4", "startsAt": "2026-11-29T09:00:00Z", "endsAt": "2026-11-29T09:30:00Z",
     "labels": {"alertname": "OutboxRelayStalled", "severity": "page", "job": "warehouse-relay"},
     "annotations": {"summary": "The warehouse outbox relay publishes nothing"}}
  ]
}`

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the JSON log lines written so far, decoded.
func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "log line %q", sc.Text())
		out = append(out, m)
	}
	return out
}

type bundle struct {
	url  string
	logs *syncBuffer
}

// setup serves alertlog on 127.0.0.1:0 until the test ends, and checks that it stops cleanly.
func setup(t *testing.T) bundle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- alertlog.Serve(ctx, ln, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("alertlog.Serve did not return after its context was cancelled")
		}
	})
	return bundle{url: "http://" + ln.Addr().String(), logs: logs}
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b.String()
}

func TestAlertlog(t *testing.T) {
	t.Parallel()

	t.Run("logs every alert of a notification as one JSON line", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		code, _ := do(t, http.MethodPost, b.url+"/page", notification)
		require.Equal(t, http.StatusOK, code)

		lines := b.logs.lines(t)
		var alerts []map[string]any
		for _, l := range lines {
			if l["msg"] == "alert" {
				alerts = append(alerts, l)
			}
		}
		require.Len(t, alerts, 2)

		firing := alerts[0]
		require.Equal(t, "WARN", firing["level"])
		require.Equal(t, "page", firing["receiver"])
		require.Equal(t, "/page", firing["path"])
		require.Equal(t, "firing", firing["status"])
		require.Equal(t, "OutboxRelayStalled", firing["alertname"])
		require.Equal(t, "page", firing["severity"])
		require.Equal(t, "orders-relay", firing["job"])
		require.Equal(t, "The orders outbox relay publishes nothing", firing["summary"])
		require.Equal(t, "2026-11-29T10:00:00Z", firing["starts_at"])
		require.Equal(t, "a1b2", firing["fingerprint"])
		require.Contains(t, firing["group_key"], "OutboxRelayStalled")
		require.Equal(t, map[string]any{"alertname": "OutboxRelayStalled", "severity": "page", "job": "orders-relay", "service": "orders"}, firing["labels"])
		require.Equal(t, "docs/runbook.md#outboxrelaystalled", firing["annotations"].(map[string]any)["runbook_url"])
		require.NotContains(t, firing, "ends_at")

		resolved := alerts[1]
		require.Equal(t, "INFO", resolved["level"])
		require.Equal(t, "resolved", resolved["status"])
		require.Equal(t, "warehouse-relay", resolved["job"])
		require.Equal(t, "2026-11-29T09:30:00Z", resolved["ends_at"])
	})

	t.Run("the path names the receiver when the body does not", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		code, _ := do(t, http.MethodPost, b.url+"/ticket", `{"status":"firing","alerts":[{"status":"firing","labels":{"alertname":"OutboxDeadMessages","severity":"ticket"}}]}`)
		require.Equal(t, http.StatusOK, code)

		lines := b.logs.lines(t)
		require.NotEmpty(t, lines)
		last := lines[len(lines)-1]
		require.Equal(t, "alert", last["msg"])
		require.Equal(t, "ticket", last["receiver"])
		require.Equal(t, "OutboxDeadMessages", last["alertname"])
	})

	t.Run("truncated alerts are logged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		code, _ := do(t, http.MethodPost, b.url+"/ticket", `{"receiver":"ticket","truncatedAlerts":3,"alerts":[]}`)
		require.Equal(t, http.StatusOK, code)

		lines := b.logs.lines(t)
		require.NotEmpty(t, lines)
		last := lines[len(lines)-1]
		require.Equal(t, "alerts truncated by alertmanager", last["msg"])
		require.EqualValues(t, 3, last["truncated"])
	})

	t.Run("a body that is not a notification is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		for _, body := range []string{"", "not json", `{"alerts": "many"}`, `[1, 2]`} {
			code, answer := do(t, http.MethodPost, b.url+"/page", body)
			require.Equal(t, http.StatusBadRequest, code, "body %q", body)
			require.Contains(t, answer, "not an Alertmanager notification")
		}
		for _, l := range b.logs.lines(t) {
			require.NotEqual(t, "alert", l["msg"])
		}
	})

	t.Run("a body over 1 MiB is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		big := `{"receiver":"page","externalURL":"` + strings.Repeat("x", alertlog.MaxBodyBytes) + `"}`
		code, _ := do(t, http.MethodPost, b.url+"/page", big)
		require.Equal(t, http.StatusBadRequest, code)
	})

	t.Run("healthz answers 200", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		code, body := do(t, http.MethodGet, b.url+"/healthz", "")
		require.Equal(t, http.StatusOK, code)
		require.JSONEq(t, `{"status":"ok"}`, body)
	})

	t.Run("other methods are not allowed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		code, _ := do(t, http.MethodGet, b.url+"/page", "")
		require.Equal(t, http.StatusMethodNotAllowed, code)
	})
}

func TestRun_BadAddress(t *testing.T) {
	t.Parallel()

	err := alertlog.Run(t.Context(), alertlog.Config{HTTPAddr: "not-an-address"}, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "listen")
}
