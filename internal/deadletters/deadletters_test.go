package deadletters_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/deadletters"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

// testConfig is the configuration of a service with the subcommand: SHOP_AMQP_URL and
// SHOP_DEAD_LETTER_QUEUE.
type testConfig struct {
	broker service.BrokerEnv
	queue  string
}

// run runs the shop's command line with the dead-letters subcommand and args.
func run(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runContext(t.Context(), env, args...)
}

// runContext is run until ctx ends.
func runContext(ctx context.Context, env map[string]string, args ...string) (code int, stdout, stderr string) {
	cmd := service.Command[testConfig]{
		Name: "shop", Usage: "usage: shop <command>\n",
		Load: func(environ map[string]string) (testConfig, error) {
			return testConfig{broker: service.BrokerEnv{AMQPURL: environ["SHOP_AMQP_URL"]}, queue: environ["SHOP_DEAD_LETTER_QUEUE"]}, nil
		},
		Settings: func(testConfig) service.Settings { return service.Settings{LogFormat: "text", LogLevel: "info"} },
		Commands: map[string]service.Subcommand[testConfig]{
			deadletters.Name: deadletters.Subcommand("shop", func(c testConfig) (service.BrokerEnv, string) { return c.broker, c.queue }),
		},
	}
	var out, errOut bytes.Buffer
	code = cmd.Run(ctx, append([]string{deadletters.Name}, args...), env, &out, &errOut)
	return code, out.String(), errOut.String()
}

// bundle is a broker with a dead-letter queue and a work queue of the test's own.
type bundle struct {
	amqpURL     string
	dead, work  string
	ch          *amqp.Channel
	env         map[string]string
	deleteQueue func(string)
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{amqpURL: testinfra.AMQPURL(t), dead: testinfra.UniqueName(t, "dead"), work: testinfra.UniqueName(t, "work")}
	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.ch.Confirm(false))
	for _, q := range []string{b.dead, b.work} {
		_, err := b.ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, q := range []string{b.dead, b.work} {
			_, err := b.ch.QueueDelete(q, false, false, false)
			require.NoError(t, err)
		}
	})
	b.env = map[string]string{"SHOP_AMQP_URL": b.amqpURL, "SHOP_DEAD_LETTER_QUEUE": b.dead}
	return b
}

// put publishes a dead letter into the dead-letter queue, from queue when not empty.
func (b *bundle) put(t *testing.T, id, typ, body, reason, queue string) {
	t.Helper()
	headers := amqp.Table{inboxrabbitmq.HeaderDeadReason: reason}
	if queue != "" {
		headers[inboxrabbitmq.HeaderOriginalQueue] = queue
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	confirm, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", b.dead, false, false, amqp.Publishing{
		MessageId: id, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body), Headers: headers,
	})
	require.NoError(t, err)
	acked, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked)
}

// take removes the ready messages of queue and returns their ids, in order.
func (b *bundle) take(t *testing.T, queue string) []string {
	t.Helper()
	var out []string
	for {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d.MessageId)
	}
}

// depth returns the ready messages of queue.
func (b *bundle) depth(t *testing.T, queue string) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// corpus puts the dead letters the filter tests select from.
func (b *bundle) corpus(t *testing.T) {
	t.Helper()
	const unsupported = "permanent-error: OrderCreated version 2 is not supported (1 is)"
	b.put(t, "a-1", "OrderCreated", `{"version":1,"order_id":"a-1"}`, "permanent-error: order_id is missing", b.work)
	b.put(t, "a-2", "OrderCreated", `{"version":2,"order_id":"a-2"}`, unsupported, b.work)
	b.put(t, "a-3", "OrderCreated", `{"version":2,"order_id":"a-3"}`, "max-deliveries: failed on all 5 attempts; last error: boom", b.work)
	b.put(t, "b-1", "OrderCancelled", `{"version":2,"order_id":"b-1"}`, "permanent-error: OrderCancelled version 2 is not supported (1 is)", b.work)
	b.put(t, "c-1", "OrderCreated", `version 2`, "malformed-json: body is not valid JSON", b.work)
	b.put(t, "c-2", "OrderCreated", `{"version":"2"}`, unsupported, b.work)
	b.put(t, "n-1", "OrderCreated", `{"version":2,"order_id":"n-1"}`, unsupported, "")
}

func intp(n int) *int { return &n }

func decode(t *testing.T, stdout string) deadletters.Report {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var r deadletters.Report
	require.NoError(t, dec.Decode(&r), stdout)
	require.False(t, dec.More(), "stdout holds one JSON object: %s", stdout)
	return r
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()

	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			args   []string
			stderr string
		}{
			{[]string{"--version", "abc"}, `invalid value "abc" for flag -version: not an integer`},
			{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
			{[]string{"--limit", "-1"}, "--limit must be 0 (all) or more, got -1"},
			{[]string{"--limit", "x"}, `invalid value "x" for flag -limit`},
			{[]string{"now"}, `takes no arguments but flags, got ["now"]`},
		} {
			code, stdout, stderr := run(t, map[string]string{"SHOP_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"}, tc.args...)
			require.Equal(t, 2, code, tc.args)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.stderr)
			require.Contains(t, stderr, "usage: shop "+deadletters.Usage)
		}
		code, _, stderr := run(t, nil, "--help")
		require.Equal(t, 0, code)
		require.Contains(t, stderr, "-dry-run")
	})

	t.Run("a dry run reports every group and moves nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.corpus(t)
		code, stdout, stderr := run(t, b.env, "--dry-run", "--json")
		require.Equal(t, 0, code, stderr)
		var raw map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout), &raw))
		require.Equal(t, []string{"depth", "dry_run", "examined", "failed", "groups", "left", "matched", "no_original_queue",
			"queue", "replayed", "unroutable"}, slices.Sorted(maps.Keys(raw)), "the field names are a contract")
		group := raw["groups"].([]any)[0].(map[string]any)
		require.Equal(t, []string{"count", "matched", "original_queue", "reason", "replayed", "type", "version"},
			slices.Sorted(maps.Keys(group)))

		r := decode(t, stdout)
		require.Equal(t, deadletters.Report{
			Queue: b.dead, DryRun: true, Depth: 7, Examined: 7, Matched: 7, Left: 7, NoOriginalQueue: 1, Unroutable: []string{},
			Groups: []deadletters.Group{
				{Type: "OrderCancelled", Version: intp(2), Reason: "permanent-error", OriginalQueue: b.work, Count: 1, Matched: 1},
				{Type: "OrderCreated", Reason: "malformed-json", OriginalQueue: b.work, Count: 1, Matched: 1},
				{Type: "OrderCreated", Reason: "permanent-error", OriginalQueue: b.work, Count: 1, Matched: 1},
				{Type: "OrderCreated", Version: intp(1), Reason: "permanent-error", OriginalQueue: b.work, Count: 1, Matched: 1},
				{Type: "OrderCreated", Version: intp(2), Reason: "max-deliveries", OriginalQueue: b.work, Count: 1, Matched: 1},
				{Type: "OrderCreated", Version: intp(2), Reason: "permanent-error", OriginalQueue: "", Count: 1, Matched: 1},
				{Type: "OrderCreated", Version: intp(2), Reason: "permanent-error", OriginalQueue: b.work, Count: 1, Matched: 1},
			},
		}, r)
		require.Equal(t, 7, b.depth(t, b.dead))
		require.Zero(t, b.depth(t, b.work))

		code, stdout, stderr = run(t, b.env, "--dry-run", "--type", "OrderCreated", "--version", "2")
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "dry run: would replay 2 of 7 dead letters in "+b.dead+" (nothing moved)")
		require.Contains(t, stdout, "1 matched dead letter names no queue to go back to: left in place")
		require.Regexp(t, `(?m)^COUNT +MATCHED +TYPE +VERSION +REASON +ORIGINAL QUEUE$`, stdout)
		require.Regexp(t, `(?m)^1 +1 +OrderCreated +2 +max-deliveries +`+b.work+`$`, stdout)
		require.Regexp(t, `(?m)^1 +0 +OrderCreated +- +malformed-json +`+b.work+`$`, stdout)
		require.Regexp(t, `(?m)^1 +1 +OrderCreated +2 +permanent-error +-$`, stdout)
		require.Equal(t, 7, b.depth(t, b.dead))
	})

	t.Run("the filters combine with AND", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			args []string
			want []string // replayed, in queue order
		}{
			{nil, []string{"a-1", "a-2", "a-3", "b-1", "c-1", "c-2"}},
			{[]string{"--type", "OrderCreated"}, []string{"a-1", "a-2", "a-3", "c-1", "c-2"}},
			{[]string{"--type", "OrderCreate"}, nil},
			{[]string{"--version", "2"}, []string{"a-2", "a-3", "b-1"}},
			{[]string{"--version", "3"}, nil},
			{[]string{"--reason", "version 2 is not supported"}, []string{"a-2", "b-1", "c-2"}},
			{[]string{"--reason", "max-deliveries"}, []string{"a-3"}},
			{[]string{"--type", "OrderCreated", "--version", "2", "--reason", "not supported"}, []string{"a-2"}},
			{[]string{"--limit", "3", "--version", "2"}, []string{"a-2", "a-3"}},
		} {
			t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.corpus(t)
				code, stdout, stderr := run(t, b.env, append(tc.args, "--json")...)
				require.Equal(t, 0, code, stderr)
				r := decode(t, stdout)
				require.Equal(t, len(tc.want), r.Replayed)
				require.Equal(t, 7-len(tc.want), r.Left)
				require.Equal(t, tc.want, b.take(t, b.work))
				require.Equal(t, 7-len(tc.want), b.depth(t, b.dead))
			})
		}
	})

	t.Run("text report", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.corpus(t)
		code, stdout, stderr := run(t, b.env, "--version", "2", "--reason", "not supported")
		require.Equal(t, 0, code, stderr)
		require.Regexp(t, `(?m)^COUNT +MATCHED +REPLAYED +TYPE +VERSION +REASON +ORIGINAL QUEUE$`, stdout)
		require.Regexp(t, `(?m)^1 +1 +1 +OrderCancelled +2 +permanent-error +`+b.work+`$`, stdout)
		require.Regexp(t, `(?m)^1 +0 +0 +OrderCreated +2 +max-deliveries +`+b.work+`$`, stdout)
		require.Contains(t, stdout, "replayed 2 of 7 dead letters in "+b.dead+" (5 left)")

		code, stdout, stderr = run(t, b.env, "--limit", "2")
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "replayed 2 of the first 2 of 5 dead letters in "+b.dead+" (3 left)")

		code, stdout, stderr = run(t, b.env, "--queue", b.work, "--dry-run")
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "dry run: would replay 4 of 4 dead letters in "+b.work+" (nothing moved)")
	})

	t.Run("an empty queue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		code, stdout, stderr := run(t, b.env)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "no dead letters in "+b.dead)
	})

	t.Run("failures exit 1 and say what failed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		missing := testinfra.UniqueName(t, "missing")
		code, stdout, stderr := run(t, b.env, "--queue", missing)
		require.Equal(t, 1, code)
		require.Contains(t, stderr, fmt.Sprintf("shop dead-letters: inbox: replay dead letters of %[1]s: queue %[1]q does not exist", missing))
		require.NotContains(t, stdout, "no dead letters")

		code, stdout, stderr = run(t, b.env, "--queue", missing, "--json")
		require.Equal(t, 1, code)
		r := decode(t, stdout)
		require.Contains(t, r.Error, "does not exist")
		require.Equal(t, missing, r.Queue)
		require.Contains(t, stderr, "does not exist")

		gone := testinfra.UniqueName(t, "gone")
		b.put(t, "g-1", "OrderCreated", `{"version":1}`, "permanent-error: no", gone)
		b.put(t, "w-1", "OrderCreated", `{"version":1}`, "permanent-error: no", b.work)
		code, stdout, stderr = run(t, b.env, "--json")
		require.Equal(t, 1, code)
		require.Contains(t, stderr, fmt.Sprintf("queue %q (312 NO_ROUTE)", gone))
		r = decode(t, stdout)
		require.Equal(t, 1, r.Replayed)
		require.Equal(t, 1, r.Failed)
		require.Equal(t, []string{gone}, r.Unroutable)
		require.Equal(t, []string{"w-1"}, b.take(t, b.work))
		require.Equal(t, []string{"g-1"}, b.take(t, b.dead))
	})

	t.Run("the broker's password is never printed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		port, err := testinfra.FreePort()
		require.NoError(t, err)
		const secret = "s3cr3t-pa55"
		for _, url := range []string{
			fmt.Sprintf("amqp://guest:%s@127.0.0.1:%d/", secret, port),         // nobody listens
			strings.Replace(b.amqpURL, "guest:guest@", "guest:"+secret+"@", 1), // refused
		} {
			for _, args := range [][]string{nil, {"--json"}} {
				env := map[string]string{"SHOP_AMQP_URL": url, "SHOP_DEAD_LETTER_QUEUE": b.dead}
				code, stdout, stderr := run(t, env, args...)
				require.Equal(t, 1, code, stderr)
				require.Contains(t, stderr, "shop dead-letters: connect to the broker: ")
				require.NotContains(t, stdout+stderr, secret)
			}
		}
		code, stdout, _ := run(t, map[string]string{"SHOP_AMQP_URL": fmt.Sprintf("amqp://guest:%s@127.0.0.1:%d/", secret, port)})
		require.Equal(t, 1, code)
		require.NotContains(t, stdout, secret)
	})

	t.Run("the nodes of a cluster are tried in turn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.put(t, "m-1", "OrderCreated", `{"version":1}`, "permanent-error: no", b.work)
		port, err := testinfra.FreePort()
		require.NoError(t, err)
		env := maps.Clone(b.env)
		env["SHOP_AMQP_URL"] = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/, %s", port, b.amqpURL)
		code, stdout, stderr := run(t, env, "--json")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, 1, decode(t, stdout).Replayed)
		require.Equal(t, []string{"m-1"}, b.take(t, b.work))
	})

	t.Run("an interrupted replay exits 1 and leaves the rest in place", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.put(t, "m-1", "OrderCreated", `{"version":1}`, "permanent-error: no", b.work)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		code, stdout, stderr := runContext(ctx, b.env, "--json")
		require.Equal(t, 1, code, "a script must not take an interrupted replay for a finished one: %s", stderr)
		require.Contains(t, stderr, "shop dead-letters: interrupted, the rest left in place: ")
		require.Contains(t, decode(t, stdout).Error, "context canceled")
		require.Equal(t, 1, b.depth(t, b.dead))
	})
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want *int
	}{
		{`{"version":2,"order_id":"o-1"}`, intp(2)},
		{` { "order_id" : "o-1" , "version" : 13 } `, intp(13)},
		{`{"version":-1}`, intp(-1)},
		{`{"version":"2"}`, nil},
		{`{"version":2.0}`, nil},
		{`{"version":2e0}`, nil},
		{`{"version":null}`, nil},
		{`{"Version":2}`, nil},
		{`{"event":{"version":2}}`, nil},
		{`[{"version":2}]`, nil},
		{`{"version":2}{"version":3}`, nil},
		{`version 2`, nil},
		{``, nil},
	} {
		v, ok := deadletters.Version([]byte(tc.body))
		require.Equal(t, tc.want != nil, ok, tc.body)
		if ok {
			require.Equal(t, *tc.want, v, tc.body)
		}
	}
}

// FuzzVersion: a body of any bytes is read without panicking, and a version is found only in
// valid JSON.
func FuzzVersion(f *testing.F) {
	for _, s := range []string{`{"version":1}`, `{"version":"1"}`, `[]`, `{`, `{"version":99999999999999999999}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, ok := deadletters.Version(body); ok {
			require.True(t, json.Valid(body), "a version found in %q", body)
		}
	})
}
