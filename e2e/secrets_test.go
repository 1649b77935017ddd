package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// secret is a value that must never show in what the shop prints or serves: a password of a
// database or broker URL, the admin token, a key. value is the secret as the service gets it
// (a password decoded from its URL); forms are the ways it may show.
type secret struct {
	name, value string
}

// forms are the strings whose appearance betrays s: its value; its percent-encoded forms (in
// a URL's user info, path or query: a password with @ / : % must be written so); the
// distinctive part before its first special character, which any form that cuts it
// apart still shows; and, for a value of several lines (a PEM key), each long line.
func (s secret) forms() []string {
	userinfo := strings.TrimPrefix(url.UserPassword("u", s.value).String(), "u:")
	forms := []string{s.value, userinfo, url.PathEscape(s.value), url.QueryEscape(s.value)}
	if i := strings.IndexFunc(s.value, isSpecial); i >= 12 {
		forms = append(forms, s.value[:i])
	}
	for _, line := range strings.Split(s.value, "\n") {
		if line = strings.TrimSpace(line); len(line) >= 16 && !strings.HasPrefix(line, "-----") {
			forms = append(forms, line)
		}
	}
	return forms
}

func isSpecial(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-')
}

// secrets are every secret of a test.
type secrets []secret

// check fails the test for each form of each secret that text (what where names) contains,
// quoting the line it is on.
func (ss secrets) check(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range ss {
		for _, form := range s.forms() {
			if i := strings.Index(text, form); i >= 0 {
				start := strings.LastIndexByte(text[:i], '\n') + 1
				end := strings.IndexByte(text[i:], '\n')
				if end < 0 {
					end = len(text) - i
				}
				t.Errorf("%s shows the %s (as %q):\n%s", where, s.name, form, text[start:i+end])
				break
			}
		}
	}
}

// newSecret returns a secret of kind: a distinctive start, then the characters a URL must
// escape (the password of a URL with them written as they are cannot be parsed).
func newSecret(kind, tail string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "S3cr3t-" + kind + "-" + hex.EncodeToString(b) + tail
}

// TestSecretsStaySecret feeds known secrets to the real binaries of both services (built
// with go build, run as processes: everything they write on stdout and stderr is read) —
// passwords in database and broker URLs, given in the variables and through *_FILE, a list
// of broker URLs, the warehouse's admin token — and drives them through every start-up and
// error path: URLs that do not parse, servers that refuse the connection, a wrong password,
// a role that may not create the database or its tables, a configuration that fails its
// checks, a handler that panics and a process that crashes, the migrate and dead-letters
// subcommands. Running processes are scraped (/metrics), probed (/readyz, also with the
// database or the broker cut off), asked for refusals (problem documents of 400, 401, 403,
// 404, 500, 503), and export their spans to an OTLP receiver of the test's. No secret may
// show in any of it, in any of its forms. Another secret (a key file's content) is one line
// in the secrets list.
func TestSecretsStaySecret(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bins := buildBinaries(t)
	mqAdmin := testinfra.AMQPURL(t)
	mgmt := brokerManagement(t, mqAdmin)

	var (
		dbPassword   = newSecret("db", "/p@ss:w%rd")
		dbWrong      = newSecret("dbwrong", "@:/")
		mqPassword   = newSecret("mq", "/p@ss:w%rd,x")
		mqWrong      = newSecret("mqwrong", "@:/")
		adminToken   = newSecret("tok", "_-.~+/AAAA")
		wrongToken   = newSecret("badtok", "xyzXYZ")
		unfitToken   = newSecret("unfittok", " with spaces")
		unfitFileTok = newSecret("unfitfiletok", "\"quoted\"")
		allSecrets   = secrets{{"database password", dbPassword}, {"wrong database password", dbWrong}, {"broker password", mqPassword},
			{"wrong broker password", mqWrong}, {"admin token", adminToken}, {"wrong admin token", wrongToken},
			{"unfit admin token", unfitToken}, {"unfit admin token of a file", unfitFileTok}}
	)

	// The database: a private server that checks passwords, with a role that may do
	// everything the services do and one that may neither create a database nor a table.
	pg := testinfra.StartPasswordServer(t)
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	for _, stmt := range []string{
		"CREATE ROLE shop LOGIN CREATEDB PASSWORD " + quote(dbPassword),
		"CREATE ROLE clerk LOGIN PASSWORD " + quote(dbPassword),
		"CREATE DATABASE clerk_db", // postgres's: clerk may connect, not create tables
	} {
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	require.NoError(t, admin.Close(ctx))
	dbURL := func(user, password string, port int, db string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.UserPassword(user, password), port, db)
	}
	dbProxy := testinfra.NewProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.Port)))
	proxyPort := func(p *testinfra.Proxy) int {
		_, port, _ := net.SplitHostPort(p.Addr())
		n, _ := strconv.Atoi(port)
		return n
	}

	// The broker: a user of the test's own with the secret password.
	mqUser := mgmt.createUser(t, mqPassword)
	mqHost := brokerHost(t, mqAdmin)
	mqURL := func(user, password, host string) string {
		// A comma inside a password is written %2C: commas separate the URLs of a list.
		return "amqp://" + strings.ReplaceAll(url.UserPassword(user, password).String(), ",", "%2C") + "@" + host + "/"
	}
	refused := func() string {
		port, err := testinfra.FreePort()
		require.NoError(t, err)
		return "127.0.0.1:" + strconv.Itoa(port)
	}
	mqProxy := testinfra.NewProxy(t, mqHost)

	// TLS files: a client certificate and its key, and the key of another certificate.
	tlsFiles := testinfra.NewTLSFiles(t)
	serverKey, err := os.ReadFile(tlsFiles.ServerKeyFile)
	require.NoError(t, err)
	allSecrets = append(allSecrets, secret{"TLS client key", tlsFiles.ClientKey}, secret{"TLS server key", string(serverKey)})

	otlp := newOTLPReceiver(t)
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content+"\n"), 0o600))
		return path
	}

	// env is a service's configuration with the secrets in use and names of the test's own:
	// the database through dbProxy, the broker through mqProxy (either can be cut), tracing
	// to the receiver, every log line down to debug.
	env := func(t *testing.T, svc string) map[string]string {
		p := strings.ToUpper(svc) + "_"
		e := map[string]string{
			p + "DATABASE_URL":            dbURL("shop", dbPassword, proxyPort(dbProxy), testinfra.UniqueName(t, svc)),
			p + "AMQP_URL":                mqURL(mqUser, mqPassword, mqProxy.Addr()),
			p + "HTTP_ADDR":               "127.0.0.1:0",
			p + "RELAY_HTTP_ADDR":         "127.0.0.1:0",
			p + "EVENTS_EXCHANGE":         testinfra.UniqueName(t, "ex"),
			p + "DEAD_LETTER_EXCHANGE":    testinfra.UniqueName(t, "dlx"),
			p + "QUEUE":                   testinfra.UniqueName(t, "q"),
			p + "DEAD_LETTER_QUEUE":       testinfra.UniqueName(t, "dlq"),
			p + "BROKER_DOWN_GRACE":       "1s",
			p + "LOG_FORMAT":              "json",
			p + "LOG_LEVEL":               "debug",
			"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.URL,
			"OTEL_BSP_SCHEDULE_DELAY":     "100",
		}
		if svc == "orders" {
			e["ORDERS_DATABASE_TIMEOUT"], e["ORDERS_HTTP_SHUTDOWN_TIMEOUT"], e["ORDERS_CONSUMER_SHUTDOWN_TIMEOUT"] = "2s", "2s", "2s"
		} else {
			e["WAREHOUSE_HTTP_DB_TIMEOUT"], e["WAREHOUSE_SHUTDOWN_TIMEOUT"] = "2s", "2s"
			e["WAREHOUSE_ADMIN_TOKEN"] = adminToken
		}
		t.Cleanup(func() {
			mgmt.deleteTopology(t, e[p+"EVENTS_EXCHANGE"], e[p+"DEAD_LETTER_EXCHANGE"], e[p+"QUEUE"], e[p+"DEAD_LETTER_QUEUE"])
		})
		return e
	}
	with := func(e map[string]string, kv ...string) map[string]string {
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(e, kv[i])
			} else {
				e[kv[i]] = kv[i+1]
			}
		}
		return e
	}

	// The start-up and error paths of both services: each process exits with code, or, with
	// code -1, runs until its output shows until and is then stopped with SIGTERM (and exits
	// 0). probe, when set, is run against a process that runs.
	type start struct {
		name  string
		args  []string
		env   func(t *testing.T, svc, p string) map[string]string
		code  int
		until string
		want  string // in the output, when set: the path was taken
		probe func(t *testing.T, p *process, svc string)
	}
	readyz := func(status int, want ...string) func(t *testing.T, p *process, svc string) {
		return func(t *testing.T, p *process, svc string) {
			body := p.waitHTTP(t, "GET", "/readyz", nil, nil, status)
			for _, w := range want {
				require.Contains(t, body, w)
			}
			allSecrets.check(t, "/readyz", body)
		}
	}
	for _, svc := range []string{"orders", "warehouse"} {
		for _, tc := range []start{
			{name: "database URL with a bad port", args: []string{"api"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", "postgres://shop:"+url.QueryEscape(dbPassword)+"@127.0.0.1:54x32/db")
			}},
			{name: "database URL with a bad escape", args: []string{"migrate"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", "postgres://shop:"+strings.ReplaceAll(url.QueryEscape(dbPassword), "%25", "%zz")+"@127.0.0.1:5432/db")
			}},
			{name: "database URL with the password not escaped", args: []string{"api"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", "postgres://shop:"+dbPassword+"@127.0.0.1:5432/db")
			}},
			{name: "database URL of a file, not escaped", args: []string{"migrate"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", "", p+"DATABASE_URL_FILE", file(svc+"-db-url", "postgres://shop:"+dbPassword+"@127.0.0.1:5432/db"))
			}},
			{name: "database URL in the variable and its file", args: []string{"api"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				e := env(t, svc)
				return with(e, p+"DATABASE_URL_FILE", file(svc+"-db-url-both", e[p+"DATABASE_URL"]))
			}},
			{name: "database refusing the connection", args: []string{"api"}, code: -1, until: "open database", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", dbURL("shop", dbPassword, mustPort(t, refused()), "db"))
			}},
			{name: "migrate, the database refusing the connection", args: []string{"migrate"}, code: -1, until: "open database", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", dbURL("shop", dbPassword, mustPort(t, refused()), "db"))
			}},
			{name: "wrong database password", args: []string{"api"}, code: 1, want: "28P01", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", dbURL("shop", dbWrong, pg.Port, "db"))
			}},
			{name: "a role that may not create the database", args: []string{"migrate"}, code: 1, want: "42501", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", dbURL("clerk", dbPassword, pg.Port, testinfra.UniqueName(t, "nodb")))
			}},
			{name: "a migration the server refuses", args: []string{"all"}, code: 1, want: "42501", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", dbURL("clerk", dbPassword, pg.Port, "clerk_db"))
			}},
			{name: "broker URL with a bad port", args: []string{"api"}, code: 1, want: "invalid port after host", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", "amqp://shop:"+url.QueryEscape(mqPassword)+"@127.0.0.1:56x72/")
			}},
			{name: "broker URLs, the second not escaped", args: []string{"relay"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", mqURL(mqUser, mqPassword, mqHost)+",amqp://shop:"+mqPassword+"@127.0.0.1:5672/")
			}},
			{name: "broker URLs of a file, one with a bad escape", args: []string{"api"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				bad := "amqp://shop:" + strings.ReplaceAll(url.QueryEscape(mqPassword), "%25", "%zz") + "@127.0.0.1:5672/"
				return with(env(t, svc), p+"AMQP_URL", "", p+"AMQP_URL_FILE", file(svc+"-mq-url", mqURL(mqUser, mqPassword, mqHost)+","+bad))
			}},
			{name: "brokers refusing the connection", args: []string{"all"}, code: -1, until: "started", probe: readyz(503), env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", mqURL("shop", mqPassword, refused())+", "+mqURL("shop", mqPassword, refused()))
			}},
			{name: "wrong broker password", args: []string{"all"}, code: -1, until: "started", probe: readyz(503), env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", mqURL(mqUser, mqWrong, mqHost))
			}},
			{name: "dead-letters, brokers refusing the connection", args: []string{"dead-letters"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", mqURL("shop", mqPassword, refused())+","+mqURL("shop", mqPassword, refused()))
			}},
			{name: "dead-letters, wrong broker password", args: []string{"dead-letters", "--json"}, code: 1, want: "username or password not allowed", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", mqURL(mqUser, mqWrong, mqHost))
			}},
			{name: "dead-letters, broker URL not escaped", args: []string{"dead-letters"}, code: 1, env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", "amqp://shop:"+mqPassword+"@127.0.0.1:5672/")
			}},
			{name: "broker TLS, the key of another certificate", args: []string{"api"}, code: 1, want: "AMQP_KEY_FILE", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"AMQP_URL", strings.Replace(mqURL(mqUser, mqPassword, refused()), "amqp://", "amqps://", 1),
					p+"AMQP_CA_FILE", tlsFiles.CAFile, p+"AMQP_CERT_FILE", tlsFiles.ClientCertFile, p+"AMQP_KEY_FILE", tlsFiles.ServerKeyFile)
			}},
			{name: "database TLS, a key file given as the CA", args: []string{"migrate"}, code: 1, want: "DATABASE_CA_FILE", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", strings.Replace(dbURL("shop", dbPassword, pg.Port, "db"), "sslmode=disable", "sslmode=verify-full", 1),
					p+"DATABASE_CA_FILE", tlsFiles.ClientKeyFile, p+"DATABASE_CERT_FILE", tlsFiles.ClientCertFile, p+"DATABASE_KEY_FILE", tlsFiles.ClientKeyFile)
			}},
			{name: "database TLS, a server without TLS", args: []string{"migrate"}, code: 1, want: "the server does not take TLS", env: func(t *testing.T, svc, p string) map[string]string {
				return with(env(t, svc), p+"DATABASE_URL", strings.Replace(dbURL("shop", dbPassword, pg.Port, "db"), "sslmode=disable", "sslmode=verify-full", 1),
					p+"DATABASE_CA_FILE", tlsFiles.CAFile, p+"DATABASE_CERT_FILE", tlsFiles.ClientCertFile, p+"DATABASE_KEY_FILE", tlsFiles.ClientKeyFile)
			}},
			{name: "the database cut off while running", args: []string{"all"}, code: -1, until: "started",
				probe: func(t *testing.T, p *process, svc string) {
					p.waitHTTP(t, "GET", "/readyz", nil, nil, http.StatusOK)
					dbProxy.Cut()
					defer dbProxy.Heal()
					readyz(http.StatusServiceUnavailable, "database")(t, p, svc)
				},
				env: func(t *testing.T, svc, p string) map[string]string { return env(t, svc) }},
		} {
			t.Run(svc+"/"+tc.name, func(t *testing.T) {
				if tc.name == "the database cut off while running" {
					// It cuts the proxy the other processes use: not beside them.
				} else {
					t.Parallel()
				}
				p := startProcess(t, bins[svc], tc.args, tc.env(t, svc, strings.ToUpper(svc)+"_"))
				if tc.code >= 0 {
					require.Equal(t, tc.code, p.wait(t, 30*time.Second), "exit code; output:\n%s", p.output())
				} else {
					p.waitOutput(t, tc.until)
					if tc.probe != nil {
						tc.probe(t, p, svc)
					}
					require.Equal(t, 0, p.stop(t), "exit code after SIGTERM; output:\n%s", p.output())
				}
				require.Contains(t, p.output(), tc.want)
				allSecrets.check(t, svc+" "+strings.Join(tc.args, " ")+" output", p.output())
			})
		}
	}

	// The warehouse's admin token: unfit ones refused at start-up, in the variable or in its
	// file, and both set.
	for _, tc := range []struct {
		name string
		kv   []string
	}{
		{"an unfit admin token", []string{"WAREHOUSE_ADMIN_TOKEN", unfitToken}},
		{"an unfit admin token in its file", []string{"WAREHOUSE_ADMIN_TOKEN", "", "WAREHOUSE_ADMIN_TOKEN_FILE", file("unfit-token", unfitFileTok)}},
		{"the admin token in the variable and its file", []string{"WAREHOUSE_ADMIN_TOKEN_FILE", file("token", adminToken)}},
	} {
		t.Run("warehouse/"+tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProcess(t, bins["warehouse"], []string{"api"}, with(env(t, "warehouse"), tc.kv...))
			require.Equal(t, 1, p.wait(t, 30*time.Second), p.output())
			require.Contains(t, p.output(), "WAREHOUSE_ADMIN_TOKEN")
			allSecrets.check(t, "warehouse output", p.output())
		})
	}

	// A healthy shop with every secret in use, the URLs and the token given through *_FILE:
	// orders placed and refused, stock set by hand with the right token, refused with a
	// wrong one, a malformed header and none, the handler that creates an order panicking
	// after its commit (a 500), and then the relay panicking after its publish, which
	// crashes the process.
	t.Run("a shop at work", func(t *testing.T) {
		t.Parallel()
		we := env(t, "warehouse")
		we = with(we,
			"WAREHOUSE_DATABASE_URL", "", "WAREHOUSE_DATABASE_URL_FILE", file("w-db-url", we["WAREHOUSE_DATABASE_URL"]),
			"WAREHOUSE_AMQP_URL", "", "WAREHOUSE_AMQP_URL_FILE", file("w-mq-url", we["WAREHOUSE_AMQP_URL"]+","+mqURL(mqUser, mqPassword, mqHost)),
			"WAREHOUSE_ADMIN_TOKEN", "", "WAREHOUSE_ADMIN_TOKEN_FILE", file("w-token", adminToken))
		oe := env(t, "orders")
		oe = with(oe, "ORDERS_EVENTS_EXCHANGE", we["WAREHOUSE_EVENTS_EXCHANGE"], "ORDERS_DEAD_LETTER_EXCHANGE", we["WAREHOUSE_DEAD_LETTER_EXCHANGE"],
			"ORDERS_DATABASE_URL", "", "ORDERS_DATABASE_URL_FILE", file("o-db-url", oe["ORDERS_DATABASE_URL"]),
			"CHAOS_FAILPOINTS", "api.after-commit=panic@2,relay.after-publish=panic@3")
		warehouse := startProcess(t, bins["warehouse"], []string{"all"}, we)
		orders := startProcess(t, bins["orders"], []string{"all"}, oe)
		warehouse.waitOutput(t, "consuming")
		orders.waitOutput(t, "consuming")

		auth := func(v string) http.Header { return http.Header{"Authorization": {v}, "If-Match": {"*"}} }
		stock := []byte(`{"available": 100}`)
		for _, c := range []struct {
			header http.Header
			status int
		}{
			{auth("Bearer " + adminToken), http.StatusOK},
			{auth("Bearer " + wrongToken), http.StatusUnauthorized},
			{auth("Bearer  " + adminToken + " trailing"), http.StatusUnauthorized},
			{auth("Basic " + adminToken), http.StatusUnauthorized},
			{auth(adminToken), http.StatusUnauthorized},
			{http.Header{"If-Match": {"*"}}, http.StatusUnauthorized},
		} {
			body := warehouse.waitHTTP(t, "PUT", "/stock/BOOK-1", c.header, stock, c.status)
			allSecrets.check(t, "PUT /stock answer", body)
		}
		order := func(key string) (http.Header, []byte) {
			return http.Header{"Authorization": {"Bearer " + adminToken}, "Idempotency-Key": {key}},
				[]byte(`{"customer_id":"c-1","items":[{"sku":"BOOK-1","quantity":1}]}`)
		}
		first, body := order("k-1")
		for _, c := range []struct {
			method, path string
			header       http.Header
			body         []byte
			status       int
		}{
			{"POST", "/orders", first, body, http.StatusCreated},
			{"POST", "/orders", first, []byte(`{"customer_id":`), http.StatusBadRequest},
			{"GET", "/orders/not-an-id", first, nil, http.StatusNotFound},
			{"GET", "/nowhere", first, nil, http.StatusNotFound},
		} {
			allSecrets.check(t, c.method+" "+c.path+" answer", orders.waitHTTP(t, c.method, c.path, c.header, c.body, c.status))
		}
		for _, p := range []*process{orders, warehouse} {
			allSecrets.check(t, p.name+" /metrics", p.waitHTTP(t, "GET", "/metrics", nil, nil, http.StatusOK))
			allSecrets.check(t, p.name+" /readyz", p.waitHTTP(t, "GET", "/readyz", nil, nil, http.StatusOK))
		}
		// The second order's handler panics after its commit (api.after-commit=panic@2): a
		// 500. The third order's publish, the relay's third, panics, which crashes orders.
		header, body := order("k-2")
		allSecrets.check(t, "the answer of a handler's panic", orders.waitHTTP(t, "POST", "/orders", header, body, http.StatusInternalServerError))
		// The relay publishes a batch per order here: the warehouse has both orders once the
		// relay published twice, and the third order is its third publish.
		testinfra.Eventually(t, 30*time.Second, func() bool { return strings.Count(warehouse.output(), `"message processed"`) >= 2 },
			"the warehouse processed both orders; output:\n%s", &warehouse.out)
		// Orders' spans are exported before the crash below: a batch not yet sent when the
		// process dies is lost with it.
		testinfra.Eventually(t, 30*time.Second, func() bool { return strings.Contains(otlp.received(), "POST /orders") },
			"orders exported its spans")
		header, body = order("k-3")
		orders.send(t, "POST", "/orders", header, body)
		require.Equal(t, 2, orders.wait(t, 30*time.Second), "the relay's panic crashes orders; output:\n%s", orders.output())
		require.Contains(t, orders.output(), "panic: failpoint relay.after-publish")
		require.Contains(t, orders.output(), `"panic in handler"`)
		require.Equal(t, 0, warehouse.stop(t), warehouse.output())
		for _, p := range []*process{orders, warehouse} {
			allSecrets.check(t, p.name+" output", p.output())
		}
		require.Contains(t, otlp.received(), "POST /orders", "spans were exported")
		require.Contains(t, otlp.received(), "db.query.text")
	})

	t.Cleanup(func() {
		// After every subtest: the spans of all the processes.
		spans := otlp.received()
		allSecrets.check(t, "the exported spans", spans)
	})
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func mustPort(t *testing.T, hostport string) int {
	_, port, err := net.SplitHostPort(hostport)
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	return n
}

// buildBinaries builds cmd/orders and cmd/warehouse into a directory of the test's.
func buildBinaries(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, svc := range []string{"orders", "warehouse"} {
		bins[svc] = filepath.Join(dir, svc)
		cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bins[svc], "github.com/outboxshop/outboxshop/services/"+svc+"/cmd/"+svc)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build %s:\n%s", svc, out)
	}
	return bins
}

// process is a service's binary running with an environment of the test's alone.
type process struct {
	name string
	cmd  *exec.Cmd
	out  lockedBuffer // stdout and stderr
	done chan struct{}
	code int

	addrOnce sync.Once
	addr     string
}

func startProcess(t *testing.T, bin string, args []string, env map[string]string) *process {
	t.Helper()
	p := &process{name: filepath.Base(bin) + " " + strings.Join(args, " "), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *process) output() string { return p.out.String() }

// wait returns the exit code once the process exits, failing the test after timeout.
func (p *process) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("%s still runs after %s; output:\n%s", p.name, timeout, p.output())
		return -1
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *process) stop(t *testing.T) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait(t, 30*time.Second)
}

// waitOutput waits until the output contains s.
func (p *process) waitOutput(t *testing.T, s string) {
	t.Helper()
	testinfra.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.output(), s) },
		"%s never wrote %q; output:\n%s", p.name, s, &p.out)
}

// noKeepAlive is the tests' HTTP client: it leaves no connection behind (goleak).
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

var httpAddr = regexp.MustCompile(`"http_addr":"([^"]+)"`)

// waitHTTP sends the request until it is answered with status, and returns the answer's
// headers and body as text.
func (p *process) waitHTTP(t *testing.T, method, path string, header http.Header, body []byte, status int) string {
	t.Helper()
	var last string
	ok := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var code int
		code, last = p.send(t, method, path, header, body)
		if ok = code == status; ok {
			break
		}
	}
	require.True(t, ok, "%s %s never answered %d; last:\n%s\noutput:\n%s", method, path, status, last, p.output())
	return last
}

// send sends the request once and returns the status (0 when it failed) and the answer's
// headers and body as text (or the error).
func (p *process) send(t *testing.T, method, path string, header http.Header, body []byte) (int, string) {
	t.Helper()
	p.addrOnce.Do(func() {
		p.waitOutput(t, `"http_addr"`)
		p.addr = httpAddr.FindStringSubmatch(p.output())[1]
	})
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+p.addr+path, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var h bytes.Buffer
	_ = resp.Header.Write(&h)
	return resp.StatusCode, resp.Status + "\n" + h.String() + "\n" + string(raw)
}

// otlpReceiver is an OTLP/HTTP endpoint that keeps what it is sent. The spans' strings are
// in the protobuf bodies as they are: a secret in an attribute, an event or a status shows
// in them.
type otlpReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	bodies bytes.Buffer
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies.Write(body)
		r.bodies.WriteByte('\n')
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) received() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies.String()
}

// brokerHost is the host:port of amqpURL.
func brokerHost(t *testing.T, amqpURL string) string {
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	return u.Host
}

// management is the management HTTP API of the test broker (port 15672 of its host, with
// its credentials).
type management struct {
	api, user, password, vhost string
	amqpURL                    string
}

func brokerManagement(t *testing.T, amqpURL string) *management {
	t.Helper()
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	password, _ := u.User.Password()
	m := &management{api: "http://" + net.JoinHostPort(u.Hostname(), "15672") + "/api", user: u.User.Username(), password: password,
		vhost: strings.TrimPrefix(u.Path, "/"), amqpURL: amqpURL}
	if m.vhost == "" {
		m.vhost = "/"
	}
	if err := m.do(t.Context(), "GET", "/overview", nil); err != nil {
		msg := fmt.Sprintf("the broker's management API on %s is unavailable (%v): enable the rabbitmq_management plugin on the broker of %s",
			m.api, err, testinfra.EnvAMQPURL)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; CI=true, so this is a failure")
		}
		t.Skip(msg)
	}
	return m
}

func (m *management) do(ctx context.Context, method, path string, body any) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, m.api+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.user, m.password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, raw)
	}
	return nil
}

// createUser creates a broker user with password and every permission on the vhost, deleted
// when the test ends, and returns its name.
func (m *management) createUser(t *testing.T, password string) string {
	t.Helper()
	name := testinfra.UniqueName(t, "shop")
	ctx := context.WithoutCancel(t.Context())
	require.NoError(t, m.do(ctx, "PUT", "/users/"+url.PathEscape(name), map[string]string{"password": password, "tags": ""}))
	t.Cleanup(func() { require.NoError(t, m.do(ctx, "DELETE", "/users/"+url.PathEscape(name), nil)) })
	require.NoError(t, m.do(ctx, "PUT", "/permissions/"+url.PathEscape(m.vhost)+"/"+url.PathEscape(name),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}))
	return name
}

// deleteTopology deletes the exchanges and queues of a process, those that it declared.
func (m *management) deleteTopology(t *testing.T, exchange, dlx string, queues ...string) {
	ctx := context.WithoutCancel(t.Context())
	for _, q := range queues {
		if err := m.do(ctx, "DELETE", "/queues/"+url.PathEscape(m.vhost)+"/"+url.PathEscape(q), nil); err != nil && !strings.Contains(err.Error(), "404") {
			t.Errorf("delete queue: %v", err)
		}
	}
	for _, ex := range []string{exchange, dlx} {
		if err := m.do(ctx, "DELETE", "/exchanges/"+url.PathEscape(m.vhost)+"/"+url.PathEscape(ex), nil); err != nil && !strings.Contains(err.Error(), "404") {
			t.Errorf("delete exchange: %v", err)
		}
	}
}
