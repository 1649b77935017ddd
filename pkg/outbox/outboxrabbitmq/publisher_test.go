package outboxrabbitmq_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func message(exchange string) outbox.Message {
	return outbox.Message{
		ID: uuid.New(), Exchange: exchange, RoutingKey: "k", Type: "T",
		AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`), CreatedAt: time.Now(),
	}
}

func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ConfirmsABatch", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url})
		require.NoError(t, err)
		defer pub.Close()
		batch := make([]outbox.Message, 500)
		for i := range batch {
			batch[i] = message(top.Exchange)
		}
		for i, err := range pub.Publish(ctx, batch) {
			require.NoError(t, err, "message %d", i)
		}
		require.Equal(t, 500, queueDepth(t, url, top.Queue))
	})

	t.Run("ReturnedMessageIsNotPublished", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		testinfra.DeleteExchangeAtCleanup(t, url, top.Exchange+".nowhere")
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url, Setup: func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(top.Exchange+".nowhere", "topic", false, true, false, false, nil)
		}})
		require.NoError(t, err)
		defer pub.Close()
		errs := pub.Publish(ctx, []outbox.Message{message(top.Exchange), message(top.Exchange + ".nowhere"), message(top.Exchange)})
		require.NoError(t, errs[0])
		require.ErrorIs(t, errs[1], outboxrabbitmq.ErrUnroutable)
		require.NoError(t, errs[2])
	})

	t.Run("ReconnectsAfterConnectionLoss", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		proxy := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", must(amqp.ParseURI(url)).Host, must(amqp.ParseURI(url)).Port))
		var ups, downs atomic.Int32
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: proxy.RewriteURL(t, url), Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
			if c.Up {
				ups.Add(1)
			} else {
				downs.Add(1)
			}
		}}})
		require.NoError(t, err)
		defer pub.Close()

		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		proxy.Cut()
		err = pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0]
		require.ErrorIs(t, err, outbox.ErrUnavailable, "an outage is not the message's fault")
		proxy.Heal()
		testinfra.Eventually(t, 10*time.Second, func() bool {
			return pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0] == nil
		}, "publishing again after the broker came back")
		require.GreaterOrEqual(t, ups.Load(), int32(2))
		require.GreaterOrEqual(t, downs.Load(), int32(1))
	})

	t.Run("NoConfirmBeforeDeadlineIsUnavailable", func(t *testing.T) {
		t.Parallel()
		url := testinfra.AMQPURL(t)
		top := testinfra.DeclareTopology(t, url)
		proxy := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", must(amqp.ParseURI(url)).Host, must(amqp.ParseURI(url)).Port))
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: proxy.RewriteURL(t, url), DialTimeout: time.Second})
		require.NoError(t, err)
		defer pub.Close()
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])

		// The broker receives the messages but its confirms never arrive: the broker hangs.
		proxy.Stall()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		for _, err := range pub.Publish(short, []outbox.Message{message(top.Exchange), message(top.Exchange)}) {
			require.ErrorIs(t, err, outbox.ErrUnavailable, "an unconfirmed message is never reported published")
		}
		proxy.Resume()
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0], "a fresh connection after the timeout")
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			cfg  outboxrabbitmq.Config
			want string
		}{
			"NoURL":       {outboxrabbitmq.Config{}, "URL or URLs is required"},
			"NotAMQP":     {outboxrabbitmq.Config{URL: "http://not-amqp"}, "URL:"},
			"URLAndURLs":  {outboxrabbitmq.Config{URL: "amqp://a/", URLs: []string{"amqp://b/"}}, "set URL or URLs, not both"},
			"EmptyInURLs": {outboxrabbitmq.Config{URLs: []string{"amqp://a/", ""}}, "URLs[1] is empty"},
			"BadInURLs":   {outboxrabbitmq.Config{URLs: []string{"amqp://a/", "amqp://user:s3cret@b:port/"}}, "URLs[1]: invalid port"},
			// amqp091-go would connect in the clear, or ignore the URL's files.
			"TLSConfigWithPlainURL": {outboxrabbitmq.Config{URLs: []string{"amqps://a/", "amqp://b/"}, TLSClientConfig: &tls.Config{}},
				"URLs[1] is amqp://, which TLSClientConfig does not apply to: use amqps://"},
			"TLSConfigAndURLFiles": {outboxrabbitmq.Config{URL: "amqps://a/?cacertfile=/ca.pem", TLSClientConfig: &tls.Config{}},
				"URL has TLS parameters (cacertfile, certfile, keyfile or server_name_indication) and TLSClientConfig is set"},
			// A password with a / not percent-encoded: the parser quotes it as the port.
			"UnescapedPassword": {outboxrabbitmq.Config{URL: "amqp://user:s3cret/x@b:5672/"}, "URL: invalid port after host"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				_, err := outboxrabbitmq.New(tc.cfg)
				require.ErrorContains(t, err, tc.want)
				require.NotContains(t, err.Error(), "s3cret", "a bad URL's password stays out of the error")
			})
		}
	})

	t.Run("WithDefaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := outboxrabbitmq.Config{URL: "amqp://a/"}.WithDefaults()
		require.NoError(t, err)
		require.Equal(t, outboxrabbitmq.DefaultConnectionName, cfg.ConnectionName)
		require.Equal(t, outboxrabbitmq.DefaultDialTimeout, cfg.DialTimeout)
		require.Equal(t, 1, cfg.Connections)
		require.Zero(t, cfg.MaxMessageBytes, "0 checks nothing")
		require.NotNil(t, cfg.Logger)
		_, err = outboxrabbitmq.Config{URL: "amqp://a/", Connections: outboxrabbitmq.MaxConnections + 1, MaxMessageBytes: -1}.WithDefaults()
		require.ErrorContains(t, err, "outbox: invalid rabbitmq publisher config: ")
		require.ErrorContains(t, err, "connections must be between")
		require.ErrorContains(t, err, "max message bytes must be >= 0")
	})
}

// TestPublisherURLs checks the failover between the URLs of a list, with proxies in front of
// one broker standing for the nodes of a cluster (the cluster tests kill real nodes).
func TestPublisherURLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type node struct {
		proxy *testinfra.Proxy
		url   string
	}
	setup := func(t *testing.T, n int) (nodes []node, top testinfra.Topology, broker func() string, pub *outboxrabbitmq.Publisher) {
		url := testinfra.AMQPURL(t)
		top = testinfra.DeclareTopology(t, url)
		uri := must(amqp.ParseURI(url))
		urls := make([]string, n)
		for i := range n {
			p := testinfra.NewProxy(t, fmt.Sprintf("%s:%d", uri.Host, uri.Port))
			nodes = append(nodes, node{p, p.RewriteURL(t, url)})
			urls[i] = nodes[i].url
		}
		var connected atomic.Value
		connected.Store("")
		pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URLs: urls, DialTimeout: 2 * time.Second, Hooks: outboxrabbitmq.Hooks{Connected: func(c outboxrabbitmq.ConnectionChange) {
			if c.Up {
				connected.Store(c.Broker)
			}
		}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		return nodes, top, func() string { return connected.Load().(string) }, pub
	}
	// nodeOf is the node whose proxy has the address broker (the hook's host:port).
	nodeOf := func(t *testing.T, nodes []node, broker string) int {
		for i, n := range nodes {
			if n.proxy.Addr() == broker {
				return i
			}
		}
		t.Fatalf("connected to %q, none of the nodes", broker)
		return -1
	}

	t.Run("DeadNodesAreSkippedInOneCall", func(t *testing.T) {
		t.Parallel()
		nodes, top, broker, pub := setup(t, 3)
		nodes[0].proxy.Cut()
		nodes[1].proxy.Cut()
		// Whichever node's turn comes first, one call reaches the live one.
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		require.Equal(t, 2, nodeOf(t, nodes, broker()))
	})

	t.Run("ALostNodeFailsOverToTheNext", func(t *testing.T) {
		t.Parallel()
		nodes, top, broker, pub := setup(t, 3)
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		first := nodeOf(t, nodes, broker())
		nodes[first].proxy.Cut()
		err := pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0]
		if err != nil {
			// The loss was seen by this call (a write to the cut socket): never a success.
			require.ErrorIs(t, err, outbox.ErrUnavailable)
			require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		}
		require.Equal(t, (first+1)%3, nodeOf(t, nodes, broker()), "the next node in the list")
	})

	t.Run("AHungNodeGetsItsShareOfTheDeadline", func(t *testing.T) {
		t.Parallel()
		nodes, top, broker, pub := setup(t, 2)
		require.NoError(t, pub.Publish(ctx, []outbox.Message{message(top.Exchange)})[0])
		first := nodeOf(t, nodes, broker())
		require.NoError(t, pub.Close())
		// The node whose turn is next accepts connections and never answers.
		hung := (first + 1) % 2
		nodes[hung].proxy.Stall()
		t.Cleanup(nodes[hung].proxy.Resume)
		// Half of it (5 s) is what the live node has to connect, open a channel and confirm:
		// 2 s was not always enough on a loaded two-core machine.
		short, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, pub.Publish(short, []outbox.Message{message(top.Exchange)})[0],
			"the hung node had half the deadline; the other one the rest")
		require.Equal(t, first, nodeOf(t, nodes, broker()))
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
