package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/failpoint"
)

func TestRegistry(t *testing.T) {
	t.Parallel()

	t.Run("EveryScenarioOfTheBrief", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []string{
			"relay-before-publish", "relay-after-publish", "relay-after-mark",
			"consumer-before-commit", "consumer-after-commit", "consumer-mid-batch",
			"broker-kill", "network", "orders-db-kill", "poison", "api-after-commit", "contract-change", "broker-node-kill",
			"outbox-poison", "migrate-under-load", "broker-alarm", "relay-paused", "db-outage-long",
			"broker-minority-partition", "broker-client-partition", "pg-primary-isolated", "pg-primary-isolated-wal", "flaky-network",
			"pg-failover", "pg-flap-failover", "tls", "wal-relay-kill", "slot-dropped", "pg-failover-wal", "wal-relay-catchup-kill", "wal-relay-standby", "relay-mode-switch",
		}, Names())
	})

	t.Run("EveryScenarioInjectsSomething", func(t *testing.T) {
		t.Parallel()
		for _, s := range Scenarios() {
			require.NotNil(t, s.Inject, s.Name)
			require.NotEmpty(t, s.Summary, s.Name)
		}
	})

	t.Run("CrashPointsParse", func(t *testing.T) {
		t.Parallel()
		points := map[string]Service{}
		for _, s := range Scenarios() {
			if s.Failpoints == nil {
				continue
			}
			for _, rate := range []float64{0.5, 40, 500} {
				fps := s.Failpoints(rate)
				require.NotEmpty(t, fps, s.Name)
				for svc, spec := range fps {
					set, err := failpoint.Parse(spec)
					require.NoError(t, err, "%s: %s", s.Name, spec)
					require.Len(t, set.Armed(), 1)
					name, _, _ := strings.Cut(spec, "=")
					points[name] = svc
				}
			}
		}
		require.Equal(t, map[string]Service{
			"relay.before-publish": OrdersRelay, "relay.after-publish": OrdersRelay, "relay.after-mark": OrdersRelay,
			"relay.lane.after-publish": OrdersRelay, "api.after-commit": OrdersAPI,
			"consumer.before-commit": Warehouse, "consumer.after-commit": Warehouse,
		}, points, "each crash point in the process that has it")
	})

	t.Run("KillAtNFallsInTheLoad", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, 3, hits(0.5, 1.5), "at least a few hits, so the process is busy when it dies")
		require.Equal(t, 60, hits(40, 1.5))
		require.Equal(t, 30, hits(40, 0.75))
	})

	t.Run("Lookup", func(t *testing.T) {
		t.Parallel()
		s, ok := Lookup("poison")
		require.True(t, ok)
		require.Equal(t, "poison", s.Name)
		_, ok = Lookup("nope")
		require.False(t, ok)
	})

	t.Run("Select", func(t *testing.T) {
		t.Parallel()
		all, err := Select("all")
		require.NoError(t, err)
		require.Len(t, all, len(Names()))

		one, err := Select("relay-after-publish")
		require.NoError(t, err)
		require.Len(t, one, 1)

		// Registry order, no repeats, spaces tolerated.
		some, err := Select("poison, broker-kill,poison")
		require.NoError(t, err)
		require.Equal(t, "broker-kill", some[0].Name)
		require.Equal(t, "poison", some[1].Name)
		require.Len(t, some, 2)

		_, err = Select("relay-after-publsh")
		require.ErrorContains(t, err, `unknown scenario "relay-after-publsh"`)
		require.ErrorContains(t, err, "relay-after-publish", "the error lists the scenarios")
	})

	t.Run("RegisterRefusesADuplicateName", func(t *testing.T) {
		t.Parallel()
		require.Panics(t, func() { register(Scenario{Name: "poison"}) })
	})

	t.Run("ScenariosIsACopy", func(t *testing.T) {
		t.Parallel()
		s := Scenarios()
		s[0].Name = "changed"
		require.Equal(t, "relay-before-publish", Names()[0])
	})
}

func TestInitialStock(t *testing.T) {
	t.Parallel()
	s := initialStock(40, 8e9)
	require.Equal(t, int64(192), s["BOOK-1"])
	require.Equal(t, int64(24), s["BAG-1"], "BAG-1 runs out early: some orders are rejected")
	require.Len(t, s, 5)
	small := initialStock(1, 1e9)
	require.Equal(t, int64(20), small["PEN-1"])
	require.Equal(t, int64(3), small["BAG-1"])
}

func TestLoadEnd(t *testing.T) {
	t.Parallel()
	const least, most, after = 150 * time.Millisecond, 2 * time.Second, 300 * time.Millisecond

	t.Run("InjectedBeforeLeast", func(t *testing.T) {
		t.Parallel()
		start, injected := time.Now(), make(chan struct{})
		close(injected)
		end := loadEnd(t.Context(), start, least, most, injected, time.Millisecond)
		require.GreaterOrEqual(t, end.Sub(start), least, "the load stopped before its least duration")
	})
	t.Run("InjectedAfterLeast", func(t *testing.T) {
		t.Parallel()
		start, injected := time.Now(), make(chan struct{})
		var closedAt time.Time
		go func() {
			time.Sleep(2 * least)
			closedAt = time.Now()
			close(injected)
		}()
		end := loadEnd(t.Context(), start, least, most, injected, after)
		<-injected
		require.GreaterOrEqual(t, end.Sub(closedAt), after, "the load stopped sooner than after the inject")
	})
	t.Run("InjectHangs", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		end := loadEnd(t.Context(), start, least, most, make(chan struct{}), after)
		require.GreaterOrEqual(t, end.Sub(start), most)
	})
	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		start := time.Now()
		end := loadEnd(ctx, start, least, most, make(chan struct{}), after)
		require.Less(t, end.Sub(start), most, "a cancelled run waited for the limit")
	})
}
