package service_test

import (
	"context"
	"net/http"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/internal/readiness"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestProcess wires a process the way both services' apps do, against the real servers: the
// database opened and migrated, the outbox relay and the cleanups, an HTTP server on :0. A
// row added to the outbox reaches the broker, the relay's readiness check comes up, the
// registry has the pool's and the relay's metrics, and Stop closes everything.
func TestProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amqpURL := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, amqpURL)

	p := service.NewProcess("kit", "all", service.Options{})
	migrate := func(ctx context.Context, pool *pgxpool.Pool) error {
		return pgmigrate.Service(ctx, pool, "kit", fstest.MapFS{}, 7)
	}
	pool, err := p.OpenDatabase(ctx, pgdb.Config{URL: testinfra.DatabaseURL(t), Migrate: migrate})
	require.NoError(t, err)
	require.Same(t, pool, p.Pool())

	check, err := service.AddRelay(p, service.RelayConfig{
		Publisher:       outboxrabbitmq.Config{URL: amqpURL, ConnectionName: "kit-relay"},
		Settings:        service.RelaySettings{BatchSize: 10, PollInterval: 50 * time.Millisecond, MaxAttempts: 3},
		BrokerDownGrace: time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, service.AddOutboxStats(p))
	service.AddInboxCleanup(p, time.Hour, 0)
	ln, err := service.Listen(ctx, p, "127.0.0.1:0")
	require.NoError(t, err)
	service.AddServer(p, "http server", ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), time.Second)
	p.Launch(ctx)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, p.Stop())
		}
	})

	resp, err := http.Get("http://" + service.Addr(ln))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)

	require.NoError(t, outbox.Add(ctx, pool, outbox.Message{
		Exchange: top.Exchange, RoutingKey: "kit.thing", Type: "Thing", AggregateType: "thing", AggregateID: "1",
		Payload: []byte(`{"n":1}`),
	}))
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	testinfra.Eventually(t, 20*time.Second, func() bool {
		_, ok, err := ch.Get(top.Queue, true)
		return err == nil && ok
	}, "the outbox row published")
	testinfra.Eventually(t, 10*time.Second, func() bool { return check.Check(ctx) == nil }, "the relay's check up")

	families, err := p.Registry.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, n := range []string{"pgxpool_max_conns", "outbox_relay_state", "outbox_pending_messages", "go_goroutines"} {
		require.True(t, names[n], "%s registered", n)
	}

	require.NoError(t, p.Stop())
	stopped = true
	require.Error(t, pool.Ping(ctx), "the pool is closed")
	_, err = http.Get("http://" + service.Addr(ln))
	require.Error(t, err, "the server is down")
	require.Empty(t, service.Addr(nil))
}

func TestConsumerMetrics(t *testing.T) {
	t.Parallel()
	p := service.NewProcess("kit", "api", service.Options{})
	link := readiness.NewLink("not connected yet")
	m, err := service.NewConsumerMetrics(p, "kit", []string{"Thing"}, time.Hour, time.Minute, link)
	require.NoError(t, err)
	hooks := m.Hooks()
	require.NotNil(t, hooks.Connected)
	require.Error(t, readiness.Connection(link, time.Nanosecond)(context.Background()), "down until connected")
	hooks.Connected(inboxrabbitmq.ConnectionChange{Consumer: "kit", Up: true})
	require.NoError(t, readiness.Connection(link, time.Nanosecond)(context.Background()))

	families, err := p.Registry.Gather()
	require.NoError(t, err)
	window := 0.0
	for _, f := range families {
		if f.GetName() == "inbox_redelivery_window_seconds" {
			window = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	require.Equal(t, 60.0, window)
	_, err = service.NewConsumerMetrics(p, "kit", nil, time.Hour, time.Minute, link)
	require.Error(t, err, "registered twice")
}
