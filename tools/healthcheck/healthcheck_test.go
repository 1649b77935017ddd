package healthcheck_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/tools/healthcheck"
)

func TestHealthcheckMain(t *testing.T) {
	t.Parallel()

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(http.StatusOK)
		case "/created":
			w.WriteHeader(http.StatusCreated)
		case "/moved":
			http.Redirect(w, r, "/readyz", http.StatusFound)
		case "/down":
			http.Error(w, `{"status":"database down"}`, http.StatusServiceUnavailable)
		case "/slow":
			<-r.Context().Done()
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedURL := "http://" + ln.Addr().String() + "/readyz"
	require.NoError(t, ln.Close())

	for _, tc := range []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{name: "2xx is healthy", args: []string{srv.URL + "/readyz"}, wantCode: 0},
		{name: "any 2xx is healthy", args: []string{srv.URL + "/created"}, wantCode: 0},
		{name: "redirect to 2xx is healthy", args: []string{srv.URL + "/moved"}, wantCode: 0},
		{name: "503 is unhealthy with the body", args: []string{srv.URL + "/down"}, wantCode: 1, wantStderr: "503 Service Unavailable: {\"status\":\"database down\"}"},
		{name: "404 is unhealthy", args: []string{srv.URL + "/nope"}, wantCode: 1, wantStderr: "404 Not Found"},
		{name: "timeout is unhealthy", args: []string{"-timeout", "50ms", srv.URL + "/slow"}, wantCode: 1, wantStderr: "deadline exceeded"},
		{name: "connection refused is unhealthy", args: []string{closedURL}, wantCode: 1, wantStderr: "connection refused"},
		{name: "not an http URL is unhealthy", args: []string{"127.0.0.1:8080/readyz"}, wantCode: 1, wantStderr: "is not an http(s) URL"},
		{name: "no URL is a usage error", args: nil, wantCode: 2, wantStderr: "usage: healthcheck"},
		{name: "two URLs is a usage error", args: []string{srv.URL, srv.URL}, wantCode: 2, wantStderr: "usage: healthcheck"},
		{name: "zero timeout is a usage error", args: []string{"-timeout", "0s", srv.URL}, wantCode: 2},
		{name: "unknown flag is a usage error", args: []string{"-retries", "3", srv.URL}, wantCode: 2},
		{name: "help", args: []string{"-h"}, wantCode: 0, wantStderr: "usage: healthcheck"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			code := healthcheck.Main(context.Background(), tc.args, &stderr)
			require.Equal(t, tc.wantCode, code, "stderr: %s", stderr.String())
			if tc.wantCode == 0 && tc.wantStderr == "" {
				require.Empty(t, stderr.String())
			}
			require.Contains(t, stderr.String(), tc.wantStderr)
		})
	}
}

func TestCheck_CancelledContext(t *testing.T) {
	t.Parallel()

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := healthcheck.Check(ctx, srv.Client(), srv.URL)
	require.ErrorIs(t, err, context.Canceled)
}
