package outbox_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// TestTLS runs both relays against a PostgreSQL server and a RabbitMQ node that take TLS
// alone, with a private CA and client certificates: the pool and the polling relay as an
// adopter's URL says it (sslmode=verify-full&sslrootcert=…), the WAL relay and the publisher
// with a tls.Config (WALConfig.TLSConfig, outboxrabbitmq.Config.TLSClientConfig). A client
// that trusts another CA, or dials a name the certificate is not for, is refused on the
// certificate.
func TestTLS(t *testing.T) {
	t.Parallel()
	files, db, node := testinfra.StartTLS(t, "-c", "wal_level=logical")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pool, err := pgxpool.New(ctx, db.TLSURL("postgres")+files.TLSFileParams())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	store, err := outbox.NewStore(outbox.Tables{})
	require.NoError(t, err)
	require.NoError(t, store.CreatePublication(ctx, pool, ""))
	top := testinfra.DeclareTopology(t, node.URL)
	tlsConf := files.ClientConfig(t)
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: node.URL, TLSClientConfig: tlsConf, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	got := consume(t, node.URL, top.Queue)

	// add commits n rows of one aggregate and returns their ids.
	add := func(t *testing.T, agg string, n int) []string {
		t.Helper()
		var ids []string
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // after a commit, nothing to do
		for i := range n {
			id := uuid.New()
			require.NoError(t, outbox.Add(ctx, tx, outbox.Message{
				ID: id, Exchange: top.Exchange, RoutingKey: "tls", AggregateType: "test", AggregateID: agg,
				Type: "TestEvent", Payload: fmt.Appendf(nil, `{"i": %d}`, i),
			}))
			ids = append(ids, id.String())
		}
		require.NoError(t, tx.Commit(ctx))
		return ids
	}
	// delivered reports whether every id has been delivered.
	delivered := func(ids []string) func() bool {
		return func() bool {
			seen := got.ids()
			for _, id := range ids {
				if seen[id] == 0 {
					return false
				}
			}
			return true
		}
	}
	// relayed runs relay until every id has been delivered.
	relayed := func(t *testing.T, run func(context.Context) error, ids []string) {
		t.Helper()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(rctx) }()
		testinfra.Eventually(t, 30*time.Second, delivered(ids), "every row delivered over TLS")
		stop()
		require.NoError(t, <-done)
	}

	t.Run("PollingRelay", func(t *testing.T) {
		relay, err := outbox.NewRelay(pool, pub, fastConfig(t))
		require.NoError(t, err)
		relayed(t, relay.Run, add(t, "poll", 20))
	})
	t.Run("WALRelay", func(t *testing.T) {
		ids := add(t, "wal-before", 5) // published by the slot's snapshot at its creation
		w, err := outbox.NewWALRelay(pool, pub, fastConfig(t), outbox.WALConfig{
			URL: db.TLSURL("postgres"), TLSConfig: files.ClientConfig(t), StatusInterval: 100 * time.Millisecond,
		})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		testinfra.Eventually(t, 30*time.Second, func() bool { return w.State() == outbox.StateRunning }, "the WAL relay streams over TLS")
		ids = append(ids, add(t, "wal", 20)...)
		testinfra.Eventually(t, 30*time.Second, delivered(ids), "every row delivered by the WAL relay")
		stop()
		require.NoError(t, <-done)
		// The slot is the server's: drop it, now that its walsender ends.
		testinfra.Eventually(t, 10*time.Second, func() bool {
			_, err := pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
			return err == nil
		}, "the slot dropped")
	})
	t.Run("PublisherRefusesTheWrongServer", func(t *testing.T) {
		// The shared config was cloned for every connection: it still has no server name,
		// or the next broker's certificate would be checked against the first one's.
		require.Empty(t, tlsConf.ServerName)
		other := files.ClientConfig(t)
		other.RootCAs = x509.NewCertPool()
		otherCA, err := os.ReadFile(files.OtherCAFile)
		require.NoError(t, err)
		require.True(t, other.RootCAs.AppendCertsFromPEM(otherCA))
		for name, c := range map[string]struct {
			cfg  outboxrabbitmq.Config
			want func(error) bool
		}{
			"OtherCA": {outboxrabbitmq.Config{URL: node.URL, TLSClientConfig: other},
				func(err error) bool { _, ok := errors.AsType[x509.UnknownAuthorityError](err); return ok }},
			// The same config object that connected to localhost above.
			"OtherHostName": {outboxrabbitmq.Config{URL: strings.Replace(node.URL, testinfra.TLSHost, "127.0.0.1", 1), TLSClientConfig: tlsConf},
				func(err error) bool { _, ok := errors.AsType[x509.HostnameError](err); return ok }},
		} {
			t.Run(name, func(t *testing.T) {
				c.cfg.DialTimeout = 5 * time.Second
				p, err := outboxrabbitmq.New(c.cfg)
				require.NoError(t, err)
				defer p.Close() //nolint:errcheck // never connected
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				errs := p.Publish(pctx, []outbox.Message{{
					ID: uuid.New(), Exchange: top.Exchange, RoutingKey: "tls", AggregateType: "test", AggregateID: "refused",
					Type: "TestEvent", Payload: []byte(`{}`), CreatedAt: time.Now(),
				}})
				require.Len(t, errs, 1)
				require.Error(t, errs[0])
				require.Truef(t, c.want(errs[0]), "got %v", errs[0])
				require.False(t, outbox.IsPermanent(errs[0]), "the broker's fault, never the message's")
			})
		}
	})
}
