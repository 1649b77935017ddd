package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

// TestAdminTokenNeverLogged runs the warehouse with an admin token read from a file (as
// Kubernetes and compose give it), sets stock with it, is refused without it and with
// another, and checks that the token appears in none of the process's log lines (debug
// included), answers or metrics.
func TestAdminTokenNeverLogged(t *testing.T) {
	t.Parallel()
	const token = "app-logs-admin-token-c0ffee-42"
	cfg := testConfig(t)
	cfg.AdminToken = ""
	cfg.AdminTokenFile = filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(cfg.AdminTokenFile, []byte(token+"\n"), 0o600))

	logs := &logBuffer{}
	a, err := startApp(context.Background(), cfg, app.ModeAll, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Stop()) })
	base := "http://" + a.HTTPAddr()

	var answers strings.Builder
	send := func(auth string) int {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, base+"/stock/PEN-1", strings.NewReader(`{"available": 7}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("If-Match", "*")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		answers.WriteString(res.Header.Get("WWW-Authenticate") + " " + string(body))
		return res.StatusCode
	}
	require.Equal(t, http.StatusOK, send("Bearer "+token))
	require.Equal(t, http.StatusUnauthorized, send(""))
	require.Equal(t, http.StatusUnauthorized, send("Bearer "+token+"-not"))
	require.Equal(t, http.StatusUnauthorized, send("Token "+token))
	_, metrics := get(t, base+"/metrics")

	require.Positive(t, logs.count(`"msg":"stock set"`))
	require.Equal(t, 3, logs.count(`"msg":"request refused"`))
	require.Zero(t, logs.count(token), "the token in a log line")
	require.NotContains(t, answers.String(), token)
	require.NotContains(t, metrics, token)
}

// TestAdminDisabledByDefault: without a token the admin route answers 403 and says which
// variable opens it; the process says so once at start-up.
func TestAdminDisabledByDefault(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AdminToken = ""
	logs := &logBuffer{}
	a, err := startApp(context.Background(), cfg, app.ModeAPI, slog.New(slog.NewJSONHandler(logs, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Stop()) })
	require.Equal(t, 1, logs.count("the admin API is disabled"))

	req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, "http://"+a.HTTPAddr()+"/stock/PEN-1", strings.NewReader(`{"available": 7}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", "*")
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Contains(t, string(body), "set WAREHOUSE_ADMIN_TOKEN or WAREHOUSE_ADMIN_TOKEN_FILE")
}
