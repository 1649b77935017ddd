package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// The scenarios of this file run the orders service on its WAL relay
// (ORDERS_RELAY_MODE=wal), which reads the outbox's inserts from a logical replication slot:
// the local target's PostgreSQL servers run at wal_level = logical. pg-failover-wal is
// pg-failover's (scenarios_pgfailover.go).

const relayModeWAL = service.RelayModeWAL

// ordersSlot is the orders WAL relay's replication slot.
var ordersSlot = service.WALSlot("orders")

func init() {
	register(
		withSettings(crashScenario("wal-relay-kill", OrdersRelay, pointRelayAfterPublish,
			"orders WAL relay killed after the broker confirmed a batch, before marking it: the restarted relay streams the batch again "+
				"from the slot's confirmed position, and the warehouse inbox absorbs it",
			expectDuplicates(true)), "ORDERS_RELAY_MODE="+relayModeWAL),
		Scenario{
			Name: "slot-dropped",
			Summary: "an operator drops the orders WAL relay's replication slot mid-load, its walsender terminated first: the relay creates it again " +
				"at once, the rows pending then go out through its retry lane, nothing lost, no process dies",
			Inject:   injectSlotDropped,
			Check:    checks(checkSlotStreamedAgain, checkNoDeaths),
			MinLoad:  10 * time.Second,
			Settings: []string{"ORDERS_RELAY_MODE=" + relayModeWAL},
		},
		pgFailoverWALScenario(),
		walRelayCatchUpKillScenario(),
		walRelayStandbyScenario(),
		relayModeSwitchScenario(),
	)
}

// dropSlot terminates the walsender that streams slot $1, if any, and drops the slot: a
// relay that reconnects in between takes the slot again, so the caller tries until the drop
// wins.
const (
	terminateSlotReader = `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`
	dropSlot            = `SELECT pg_drop_replication_slot($1)`
	slotStreamed        = `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)`
)

func injectSlotDropped(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot := ordersSlot
	var streamed bool
	if err := conn.QueryRow(ctx, slotStreamed, slot).Scan(&streamed); err != nil {
		return fmt.Errorf("read the slot: %w", err)
	}
	if !streamed {
		return fmt.Errorf("no relay streams the slot %s 2s into the load: the orders relay is not the WAL relay", slot)
	}
	tries := 0
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = poll(dctx, 10*time.Millisecond, func() (bool, error) {
		tries++
		if _, err := conn.Exec(ctx, terminateSlotReader, slot); err != nil {
			return false, fmt.Errorf("terminate the slot's walsender: %w", err)
		}
		_, err := conn.Exec(ctx, dropSlot, slot)
		return err == nil, nil // "is active for PID": the relay took it again first
	})
	if err != nil {
		return fmt.Errorf("drop the slot %s (%d tries): %w", slot, tries, err)
	}
	droppedAt := time.Now()
	e.Fault(droppedAt, "the slot %s dropped (pg_terminate_backend of its walsender, pg_drop_replication_slot; %d tries)", slot, tries)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = poll(sctx, 100*time.Millisecond, func() (bool, error) {
		var ok bool
		if err := conn.QueryRow(ctx, slotStreamed, slot).Scan(&ok); err != nil {
			return false, fmt.Errorf("read the slot: %w", err)
		}
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("the relay did not stream a new slot within 30s of the drop: %w", err)
	}
	e.Healed("the relay streams a new slot %s %.1fs after the drop", slot, time.Since(droppedAt).Seconds())
	return nil
}

// checkSlotStreamedAgain requires the orders relay to stream its slot at the end.
func checkSlotStreamedAgain(ctx context.Context, e *Env, o *Outcome) {
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("connect to the orders database: %v", err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, slotStreamed, ordersSlot).Scan(&ok); err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("read the slot: %v", err))
		return
	}
	if !ok {
		o.Failures = append(o.Failures, "no relay streams the orders slot at the end")
	}
}

// ---- wal-relay-catchup-kill ----

// pointLaneAfterPublish is the WAL relay's retry lane's crash point. Armed from the start,
// it fires at the lane's first batch, which only a catch-up makes in this scenario.
const pointLaneAfterPublish = outbox.FailpointLaneAfterPublish

func walRelayCatchUpKillScenario() Scenario {
	return Scenario{
		Name: "wal-relay-catchup-kill",
		Summary: "the orders WAL relay SIGSTOPped for 2s and its slot dropped meanwhile: resumed, it creates the slot again and its retry lane " +
			"publishes the rows pending then (a catch-up); killed once the broker confirmed the lane's first batch, before its marks; " +
			"restarted, it publishes them again and the warehouse inbox absorbs them",
		Failpoints: func(float64) map[Service]string {
			return map[Service]string{OrdersRelay: pointLaneAfterPublish + "=kill@1"}
		},
		Inject:   injectCatchUpKill,
		Check:    checks(checkSlotStreamedAgain, expectDuplicates(true)),
		MinLoad:  10 * time.Second,
		Settings: []string{"ORDERS_RELAY_MODE=" + relayModeWAL},
	}
}

// countPending counts the orders outbox's rows not yet published nor dead.
const countPending = `SELECT count(*) FROM outbox_messages WHERE published_at IS NULL AND dead_at IS NULL`

func injectCatchUpKill(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	// Paused, the relay cannot take the slot back: one drop wins, and the orders written
	// meanwhile are pending when it creates the slot again.
	if err := e.Target.Pause(ctx, OrdersRelay); err != nil {
		return fmt.Errorf("pause %s: %w", OrdersRelay, err)
	}
	pausedAt := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			_ = e.Target.Resume(context.WithoutCancel(ctx), OrdersRelay)
		}
	}()
	e.Fault(pausedAt, "%s, which streams the slot, SIGSTOPped", OrdersRelay)
	if !sleepCtx(ctx, 2*time.Second) {
		return ctx.Err()
	}
	if _, err := conn.Exec(ctx, terminateSlotReader, ordersSlot); err != nil {
		return fmt.Errorf("terminate the slot's walsender: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := poll(dctx, 50*time.Millisecond, func() (bool, error) {
		_, err := conn.Exec(ctx, dropSlot, ordersSlot)
		return err == nil, nil // "is active for PID" until its walsender has ended
	}); err != nil {
		return fmt.Errorf("drop the slot %s: %w", ordersSlot, err)
	}
	var pending int
	if err := conn.QueryRow(ctx, countPending).Scan(&pending); err != nil {
		return fmt.Errorf("count the pending rows: %w", err)
	}
	e.Fault(time.Now(), "the slot %s dropped while %s was paused, %d rows pending", ordersSlot, OrdersRelay, pending)
	if err := e.Target.Resume(ctx, OrdersRelay); err != nil {
		return fmt.Errorf("resume %s: %w", OrdersRelay, err)
	}
	resumed = true
	e.Healed("%s resumed (SIGCONT) %.1fs after the pause", OrdersRelay, time.Since(pausedAt).Seconds())

	return crashedAndHealed(ctx, e, OrdersRelay, pointLaneAfterPublish, " in the catch-up, its retry lane's first batch confirmed")
}

// ---- wal-relay-standby ----

// Two orders WAL relays: one streams the slot, the other stands by. The walsender of a
// relay that stops answering lives until wal_sender_timeout: the scenario lowers it, so that
// a paused relay's takeover fits in the load.
const (
	standbyWALSenderTimeout = 3 * time.Second
	// standbyTakeoverBound: the timeout, the standby's next try (ORDERS_RELAY_POLL_INTERVAL,
	// 1s) and its session's start, with room for a loaded machine.
	standbyTakeoverBound = 15 * time.Second
)

// slotReader names the process (its application_name: the replica) whose walsender streams
// slot $1, or ” when none does.
const slotReader = `
SELECT coalesce((SELECT a.application_name FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
                 WHERE s.slot_name = $1), '')`

func walRelayStandbyScenario() Scenario {
	return Scenario{
		Name: "wal-relay-standby",
		Summary: "two orders WAL relays, one streaming and one standing by: the streaming one SIGSTOPped (its walsender ends after " +
			"wal_sender_timeout) and the standby takes over; the paused one resumed stands by; the new streaming one paused and " +
			"SIGKILLed, and the first takes over at once; nothing lost, nothing applied twice",
		Inject:   injectWALRelayStandby,
		Check:    checkSlotStreamedAgain,
		MinLoad:  25 * time.Second,
		Replicas: map[Service]int{OrdersRelay: 2},
		Settings: []string{"ORDERS_RELAY_MODE=" + relayModeWAL},
	}
}

func injectWALRelayStandby(ctx context.Context, e *Env) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The server is the target's for the whole run: set back whatever happens here.
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET wal_sender_timeout = '"+standbyWALSenderTimeout.String()+"'"); err != nil {
		return fmt.Errorf("lower wal_sender_timeout: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ALTER SYSTEM RESET wal_sender_timeout")
		_, _ = conn.Exec(rctx, "SELECT pg_reload_conf()")
	}()
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload the configuration: %w", err)
	}
	slot := ordersSlot
	relays := []Service{OrdersRelay, Replica(OrdersRelay, 2)}
	other := func(s Service) Service {
		if s == relays[0] {
			return relays[1]
		}
		return relays[0]
	}
	// reader waits until one of the relays streams the slot (not except), and returns it.
	reader := func(except Service, bound time.Duration) (Service, time.Duration, error) {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		var got Service
		err := poll(rctx, 50*time.Millisecond, func() (bool, error) {
			var name string
			if err := conn.QueryRow(ctx, slotReader, slot).Scan(&name); err != nil {
				return false, fmt.Errorf("read the slot's reader: %w", err)
			}
			got = Service(name)
			return got != "" && got != except && slices.Contains(relays, got), nil
		})
		return got, time.Since(start), err
	}

	active, _, err := reader("", 20*time.Second)
	if err != nil {
		return fmt.Errorf("no orders relay streams the slot %s: %w", slot, err)
	}
	standby := other(active)

	// 1. The streaming relay stops answering: its walsender ends after the timeout, and the
	// standby takes the slot.
	if err := e.Target.Pause(ctx, active); err != nil {
		return fmt.Errorf("pause %s: %w", active, err)
	}
	pausedAt := time.Now()
	e.Fault(pausedAt, "%s, which streams the slot, SIGSTOPped (wal_sender_timeout %s)", active, standbyWALSenderTimeout)
	got, took, err := reader(active, standbyTakeoverBound)
	if err != nil {
		_ = e.Target.Resume(context.WithoutCancel(ctx), active)
		return fmt.Errorf("the standby %s did not take the slot within %s of the pause: %w", standby, standbyTakeoverBound, err)
	}
	e.Saw("%s streams the slot %.1fs after %s was paused", got, took.Seconds(), active)

	// 2. The paused relay comes back to find the slot taken: it stands by, and the slot
	// stays with the new one.
	if err := e.Target.Resume(ctx, active); err != nil {
		return fmt.Errorf("resume %s: %w", active, err)
	}
	e.Healed("%s resumed (SIGCONT) %.1fs after the pause", active, time.Since(pausedAt).Seconds())
	if !sleepCtx(ctx, 2*time.Second) {
		return ctx.Err()
	}
	var now string
	if err := conn.QueryRow(ctx, slotReader, slot).Scan(&now); err != nil {
		return fmt.Errorf("read the slot's reader: %w", err)
	}
	if Service(now) != standby {
		e.Fail("2s after %s resumed, the slot is streamed by %q, not by %s, which took it over", active, now, standby)
	}

	// 3. The new streaming relay dies without a word (paused, then SIGKILLed): its
	// connections close with it, and the first relay takes over at once.
	if err := e.Target.Pause(ctx, standby); err != nil {
		return fmt.Errorf("pause %s: %w", standby, err)
	}
	stopped, err := e.Target.StopService(ctx, standby, 0)
	if err != nil {
		return fmt.Errorf("kill %s: %w", standby, err)
	}
	killedAt := time.Now()
	e.Fault(killedAt, "%s, which streams the slot, SIGSTOPped and SIGKILLed (%s)", standby, stopped.Status)
	got, took, err = reader(standby, standbyTakeoverBound)
	if err != nil {
		return fmt.Errorf("%s did not take the slot within %s of the kill: %w", active, standbyTakeoverBound, err)
	}
	e.Saw("%s streams the slot %.1fs after %s was killed", got, took.Seconds(), standby)
	if err := e.Target.StartService(ctx, standby); err != nil {
		return fmt.Errorf("start %s again: %w", standby, err)
	}
	e.Healed("%s started again, standing by", standby)
	return nil
}

// ---- relay-mode-switch ----

// modeSwitchStep is how long the shop runs on each relay, or on both, between the switches.
const modeSwitchStep = 4 * time.Second

// relayModeSwitchScenario moves the orders service from the polling relay to the WAL relay
// and back, twice, as rolling deploys would (docs/runbook.md#switching-relays): the two
// orders relays are one of each kind, and the switches start one and stop the other.
func relayModeSwitchScenario() Scenario {
	poll, wal := OrdersRelay, Replica(OrdersRelay, 2)
	return Scenario{
		Name: "relay-mode-switch",
		Summary: "the orders service moved from the polling relay to the WAL relay, back, and to the WAL relay again under load, each " +
			"switch a rolling deploy in which both run a moment; the slot dropped when back on polling: nothing lost, nothing applied twice",
		Inject:   func(ctx context.Context, e *Env) error { return injectRelayModeSwitch(ctx, e, poll, wal) },
		Check:    checks(checkSlotStreamedAgain, checkNoDeaths),
		MinLoad:  6 * modeSwitchStep,
		Replicas: map[Service]int{OrdersRelay: 2},
		ProcessSettings: map[Service][]string{
			poll: {"ORDERS_RELAY_MODE=" + service.RelayModePoll},
			wal:  {"ORDERS_RELAY_MODE=" + relayModeWAL},
		},
	}
}

func injectRelayModeSwitch(ctx context.Context, e *Env, poll, wal Service) error {
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDB)
	if err != nil {
		return fmt.Errorf("connect to the orders database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// stop ends a relay as a deploy does, start brings it back; each waits.
	stop := func(svc Service) error {
		st, err := e.Target.StopService(ctx, svc, restartGrace)
		if err != nil {
			return fmt.Errorf("stop %s: %w", svc, err)
		}
		if !st.Clean() {
			e.Fail("%s did not stop cleanly: %s after %s", svc, st.Status, st.Took)
		}
		return nil
	}
	start := func(svc Service) error {
		if err := e.Target.StartService(ctx, svc); err != nil {
			return fmt.Errorf("start %s: %w", svc, err)
		}
		return nil
	}
	steps := []struct {
		what        string
		run         func() error
		dropSlot    bool
		thenOnlyRun Service
	}{
		{what: "poll -> wal", run: func() error { return stop(poll) }, thenOnlyRun: wal},
		{what: "wal -> poll", run: func() error {
			if err := start(poll); err != nil {
				return err
			}
			return stop(wal)
		}, dropSlot: true, thenOnlyRun: poll},
		{what: "poll -> wal", run: func() error {
			if err := start(wal); err != nil {
				return err
			}
			return stop(poll)
		}, thenOnlyRun: wal},
	}
	for _, s := range steps {
		at := time.Now()
		if err := s.run(); err != nil {
			return err
		}
		e.Fault(at, "switched %s: %s runs alone now (%.1fs)", s.what, s.thenOnlyRun, time.Since(at).Seconds())
		if s.dropSlot {
			// Back on polling for good: the slot would keep the WAL (the runbook's step).
			// The walsender of the WAL relay just stopped ends a moment after it: until then
			// the drop fails ("is active for PID").
			deadline := time.Now().Add(15 * time.Second)
			for {
				_, err := conn.Exec(ctx, dropSlot, ordersSlot)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("drop the slot after the switch to polling: %w", err)
				}
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return ctx.Err()
				}
			}
			e.Saw("the slot dropped once no WAL relay ran")
		}
		if !sleepCtx(ctx, modeSwitchStep) {
			return ctx.Err()
		}
	}
	e.Healed("the orders service runs on its WAL relay again")
	return nil
}
