package service_test

import (
	"context"
	"net/http"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/pgmigrate"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestProcess wires a process the way both services' apps do, against the real servers: the
// database opened and migrated, the outbox relay, the inbox consumer and the cleanups, an
// HTTP server on :0. A row added to the outbox reaches the broker and the consumer's handler,
// whose counting callback runs once its transaction committed; both readiness checks come up,
// the registry has the pool's, the relay's and the consumer's metrics (the redelivery window
// among them), and Stop closes everything.
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
	handled := make(chan string, 1)
	consumerSettings := service.ConsumerSettings{MaxDeliveries: 2, RetryBaseDelay: time.Second, RetryMaxDelay: 4 * time.Second}
	consumer, consumerCheck, err := service.AddConsumer(p, service.ConsumerConfig{
		Consumer: inboxrabbitmq.Config{
			URLs: []string{amqpURL}, Queue: top.Queue, Name: "kit",
			DeadLetterRoutingKey: "kit.dead", // nothing here is dead-lettered
			Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
				// Runs only if the inbox transaction commits: the pool is aftercommit's.
				aftercommit.Register(tx, func() { handled <- d.Type })
				return nil
			},
		},
		Settings:         consumerSettings,
		KnownTypes:       []string{"Thing"},
		Retention:        time.Hour,
		RelayMaxAttempts: 3,
		BrokerDownGrace:  time.Second,
	})
	require.NoError(t, err)
	require.Equal(t, "consumer", consumerCheck.Name)
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
	select {
	case typ := <-handled:
		require.Equal(t, "Thing", typ)
	case <-time.After(20 * time.Second):
		t.Fatal("the outbox row did not reach the consumer's handler within 20s")
	}
	testinfra.Eventually(t, 10*time.Second, func() bool { return check.Check(ctx) == nil }, "the relay's check up")
	testinfra.Eventually(t, 10*time.Second, func() bool { return consumerCheck.Check(ctx) == nil }, "the consumer's check up")
	require.True(t, consumer.Status().Running)

	families, err := p.Registry.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	window := 0.0
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetName() == "inbox_redelivery_window_seconds" {
			window = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	for _, n := range []string{"pgxpool_max_conns", "outbox_relay_state", "outbox_pending_messages", "inbox_messages_processed_total",
		"inbox_pool_shortfall_connections", "go_goroutines"} {
		require.True(t, names[n], "%s registered", n)
	}
	require.Equal(t, service.RedeliveryWindow(consumerSettings, 3).Seconds(), window)
	_, _, err = service.AddConsumer(p, service.ConsumerConfig{Consumer: inboxrabbitmq.Config{
		URLs: []string{amqpURL}, Queue: top.Queue, Name: "kit", DeadLetterRoutingKey: "kit.dead",
		Handler: func(context.Context, pgx.Tx, inboxrabbitmq.Delivery) error { return nil },
	}})
	require.ErrorContains(t, err, "register consumer metrics", "a second consumer's metrics collide")

	require.NoError(t, p.Stop())
	stopped = true
	require.Error(t, pool.Ping(ctx), "the pool is closed")
	_, err = http.Get("http://" + service.Addr(ln))
	require.Error(t, err, "the server is down")
	require.Empty(t, service.Addr(nil))
}

// TestProcessWithTheWALRelay wires the relay in mode wal on a server at wal_level=logical:
// the migrations made the publication, the relay streams from its slot (its replication
// connection on the pool's URL without the pool's settings), and the rows reach the
// consumer's handler.
func TestProcessWithTheWALRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amqpURL := testinfra.AMQPURL(t)
	top := testinfra.DeclareTopology(t, amqpURL)
	pair := testinfra.StartLogicalPostgresPair(t)
	dbURL := pair.CreateDatabase(t, "kit_wal") + "&pool_max_conns=12"

	p := service.NewProcess("kit", "all", service.Options{})
	migrate := func(ctx context.Context, pool *pgxpool.Pool) error {
		return pgmigrate.Service(ctx, pool, "kit", fstest.MapFS{}, 7)
	}
	pool, err := p.OpenDatabase(ctx, pgdb.Config{URL: dbURL, Migrate: migrate})
	require.NoError(t, err)
	check, err := service.AddRelay(p, service.RelayConfig{
		Publisher:       outboxrabbitmq.Config{URL: amqpURL, ConnectionName: "kit-wal-relay"},
		Settings:        service.RelaySettings{Mode: service.RelayModeWAL, BatchSize: 10, PollInterval: 50 * time.Millisecond, MaxAttempts: 3},
		BrokerDownGrace: time.Second,
	})
	require.NoError(t, err)
	handled := make(chan string, 20)
	_, _, err = service.AddConsumer(p, service.ConsumerConfig{
		Consumer: inboxrabbitmq.Config{
			URLs: []string{amqpURL}, Queue: top.Queue, Name: "kit", DeadLetterRoutingKey: "kit.dead",
			Handler: func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
				aftercommit.Register(tx, func() { handled <- d.ID })
				return nil
			},
		},
		Settings:        service.ConsumerSettings{MaxDeliveries: 2, RetryBaseDelay: time.Second, RetryMaxDelay: 4 * time.Second},
		KnownTypes:      []string{"Thing"},
		Retention:       time.Hour,
		BrokerDownGrace: time.Second,
	})
	require.NoError(t, err)
	p.Launch(ctx)
	t.Cleanup(func() { require.NoError(t, p.Stop()) })

	testinfra.Eventually(t, 30*time.Second, func() bool {
		var active bool
		err := pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", service.WALSlot("kit")).Scan(&active)
		return err == nil && active
	}, "the relay streams from its slot")
	want := map[string]bool{}
	for n := range 20 {
		msgs := []outbox.Message{{
			Exchange: top.Exchange, RoutingKey: "kit.thing", Type: "Thing", AggregateType: "thing", AggregateID: "1",
			Payload: []byte(`{"n":1}`),
		}}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, msgs...) }), "row %d", n)
		want[msgs[0].ID.String()] = true
	}
	got := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case id := <-handled:
			require.True(t, want[id], "an unknown message %s", id)
			got[id] = true
		case <-deadline:
			t.Fatalf("%d of %d rows reached the handler within 30s", len(got), len(want))
		}
	}
	testinfra.Eventually(t, 10*time.Second, func() bool { return check.Check(ctx) == nil }, "the relay's check up")

	// Another service on the same server, as compose runs them: its slot is its own (a
	// slot's name is the server's), and both stream.
	other := service.NewProcess("kit2", "relay", service.Options{})
	dbURL2 := pair.CreateDatabase(t, "kit2_wal") + "&pool_max_conns=12"
	_, err = other.OpenDatabase(ctx, pgdb.Config{URL: dbURL2, Migrate: func(ctx context.Context, pool *pgxpool.Pool) error {
		return pgmigrate.Service(ctx, pool, "kit2", fstest.MapFS{}, 7)
	}})
	require.NoError(t, err)
	_, err = service.AddRelay(other, service.RelayConfig{
		Publisher:       outboxrabbitmq.Config{URL: amqpURL, ConnectionName: "kit2-wal-relay"},
		Settings:        service.RelaySettings{Mode: service.RelayModeWAL, BatchSize: 10, PollInterval: 50 * time.Millisecond, MaxAttempts: 3},
		BrokerDownGrace: time.Second,
	})
	require.NoError(t, err)
	other.Launch(ctx)
	t.Cleanup(func() { require.NoError(t, other.Stop()) })
	testinfra.Eventually(t, 30*time.Second, func() bool {
		var streamed int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active",
			[]string{service.WALSlot("kit"), service.WALSlot("kit2")}).Scan(&streamed)
		return err == nil && streamed == 2
	}, "each service's relay streams a slot of its own")
}
