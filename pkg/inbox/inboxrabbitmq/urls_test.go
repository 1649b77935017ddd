package inboxrabbitmq_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// TestConsumerURLs checks the failover between the URLs of a list, with proxies in front of
// one broker standing for the nodes of a cluster (the cluster tests kill real nodes): a
// consumer whose node is lost consumes again through the next node in the list, and
// processes every message once.
func TestConsumerURLs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	target := hostPort(t, b.amqpURL)
	proxies := make([]*testinfra.Proxy, 3)
	urls := make([]string, 3)
	for i := range proxies {
		proxies[i] = testinfra.NewProxy(t, target)
		urls[i] = proxies[i].RewriteURL(t, b.amqpURL)
	}
	// The first node in the list is dead from the start: whichever node's turn comes first,
	// the consumer reaches a live one in its first attempt.
	proxies[0].Cut()
	cfg := b.config(recordEffect)
	cfg.URL, cfg.URLs = "", urls
	c, _ := b.start(t, b.pool, cfg)
	b.events.waitConnected(t, true)
	first := c.Status().Broker
	require.Contains(t, []string{proxies[1].Addr(), proxies[2].Addr()}, first)

	const messages = 20
	for i := range messages / 2 {
		b.publish(t, jsonMessage(string(rune('a'+i))))
	}
	testinfra.Eventually(t, 30*time.Second, func() bool { p, _ := b.events.counts(); return p == messages/2 }, "the first half processed")

	// The node consumed from dies; the other live one takes over.
	for _, p := range proxies {
		if p.Addr() == first {
			p.Cut()
		}
	}
	b.events.waitConnected(t, false)
	b.events.waitConnected(t, true)
	second := c.Status().Broker
	require.NotEqual(t, first, second)
	for i := messages / 2; i < messages; i++ {
		b.publish(t, jsonMessage(string(rune('a'+i))))
	}
	testinfra.Eventually(t, 30*time.Second, func() bool { p, _ := b.events.counts(); return p == messages }, "every message processed")
	for i := range messages {
		require.Equal(t, 1, b.effects(t, string(rune('a'+i))))
	}
}
