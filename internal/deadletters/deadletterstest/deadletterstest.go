// Package deadletterstest checks a service's dead-letters subcommand (internal/deadletters)
// through its binary's command line, against the real broker: both services run the same
// check.
package deadletterstest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/deadletters"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// Command runs a service's command line (internal/service Command.Run).
type Command func(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) int

// CheckCommand runs `<service> dead-letters` through cmd against the broker: the dead-letter
// queue is <SERVICE>_DEAD_LETTER_QUEUE unless --queue says otherwise, the broker
// <SERVICE>_AMQP_URL; help lists it, bad arguments exit 2, a dry run moves nothing, a
// filter replays what it selects into the queue each came from, and a queue that does not
// exist fails naming the command.
func CheckCommand(t *testing.T, service string, cmd Command) {
	t.Helper()
	prefix := strings.ToUpper(service) + "_"
	amqpURL := testinfra.AMQPURL(t)
	dead, work := testinfra.UniqueName(t, "dead"), testinfra.UniqueName(t, "work")
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	for _, q := range []string{dead, work} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}
	for _, typ := range []string{"OrderCreated", "OrderCancelled"} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", dead, false, false, amqp.Publishing{
			MessageId: "m-" + typ, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Body: []byte(`{"version":1}`),
			Headers: amqp.Table{
				inboxrabbitmq.HeaderDeadReason:    "permanent-error: " + typ + " version 1 is not supported",
				inboxrabbitmq.HeaderOriginalQueue: work,
			},
		})
		require.NoError(t, err)
		acked, err := confirm.WaitContext(ctx)
		cancel()
		require.NoError(t, err)
		require.True(t, acked)
	}
	env := map[string]string{prefix + "AMQP_URL": amqpURL, prefix + "DEAD_LETTER_QUEUE": dead, prefix + "LOG_FORMAT": "text"}
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = cmd(t.Context(), args, env, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	report := func(stdout string) deadletters.Report {
		var r deadletters.Report
		require.NoError(t, json.Unmarshal([]byte(stdout), &r), stdout)
		return r
	}

	code, stdout, _ := run("help")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "  "+deadletters.Usage+"\n")

	code, _, stderr := run("dead-letters", "--version", "abc")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `invalid value "abc" for flag -version`)

	code, stdout, stderr = run("dead-letters", "--dry-run", "--json")
	require.Equal(t, 0, code, stderr)
	r := report(stdout)
	require.Equal(t, dead, r.Queue)
	require.True(t, r.DryRun)
	require.Equal(t, 2, r.Matched)
	require.Zero(t, r.Replayed)

	code, stdout, stderr = run("dead-letters", "--type", "OrderCancelled", "--version", "1", "--json")
	require.Equal(t, 0, code, stderr)
	r = report(stdout)
	require.Equal(t, 1, r.Replayed)
	require.Equal(t, 1, r.Left)
	d, ok, err := ch.Get(work, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "m-OrderCancelled", d.MessageId)

	code, _, stderr = run("dead-letters", "--queue", testinfra.UniqueName(t, "missing"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, service+" dead-letters: ")
	require.Contains(t, stderr, "does not exist")
}
