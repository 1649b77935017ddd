package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
)

const (
	// markWaitingLimit bounds the rows one markWaiting pass marks.
	markWaitingLimit = 5000
	// markWaitingWindow bounds the rows one markWaiting pass looks at: the oldest claimable
	// ones, where the claim walks. A backlog of heads alone (every row its aggregate's only
	// one) has nothing to mark, and a pass over all of it, once per PollInterval, cost
	// PostgreSQL about 600 ms on 200,000 rows. Rows further back are looked at as they come
	// to the front. Twice the limit, so that a hot aggregate's backlog still fills a pass,
	// and the next pass runs at once.
	markWaitingWindow = 2 * markWaitingLimit
	// repairEvery is how many markWaiting passes there are to one repairWaiting.
	repairEvery = 60
)

// maintenance is a relay's upkeep of the claim's index: its passes take rows that wait
// behind an older pending row of their aggregate out of the index (markWaiting), so that a
// claim costs about its batch whatever one aggregate's backlog, and now and then make every
// aggregate's oldest pending row claimable again (repairWaiting). [Relay.Run] runs the
// passes on a goroutine of their own (loop), so that a long pass never delays a batch; a
// relay that only [Relay.PublishBatch] drives runs them from its claims (maybeRun). The
// claim is correct without the passes, only slower.
type maintenance struct {
	db                         RelayDB
	markWaiting, repairWaiting string        // the relay's statements
	timeout                    time.Duration // bounds a pass: ClaimTimeout
	// failures spaces failed passes with the outage backoff and logs them once per streak.
	failures *retry.Streak

	// inRun is set while Run's goroutine runs the passes: claims then run none.
	inRun atomic.Bool
	// repairNow asks the next pass to run repairWaiting, and to run at once. It is apart
	// from sched so that asking never waits for a pass in progress (requestRepair).
	repairNow atomic.Bool

	mu     sync.Mutex // held through a pass: passes run one at a time
	sched  maintSchedule
	marked int64 // rows the last markWaiting pass marked
}

func newMaintenance(db RelayDB, sql statements, cfg Config, failures *retry.Streak) *maintenance {
	return &maintenance{
		db: db, markWaiting: sql.markWaiting, repairWaiting: sql.repairWaiting,
		timeout: cfg.ClaimTimeout, failures: failures,
		sched: maintSchedule{every: cfg.PollInterval},
	}
}

// maintSchedule says when maintenance passes run, from what the passes before found.
type maintSchedule struct {
	// every is the time between passes when nothing asks for one sooner: PollInterval.
	every time.Duration
	// last is when the last pass began, and passes how many began.
	last   time.Time
	passes int
	// more: the last markWaiting pass was full, so more rows wait to be marked.
	more bool
	// after: the last pass failed; none runs before then, whatever asks for one.
	after time.Time
}

// due reports whether a pass runs at now: after a full pass (to finish taking a backlog
// out of the claim's way), when a repair was asked for, else once per every; never during
// a failed pass's backoff.
func (s maintSchedule) due(now time.Time, repairAsked bool) bool {
	if now.Before(s.after) {
		return false
	}
	return s.more || repairAsked || now.Sub(s.last) >= s.every
}

// wait is how long the maintenance loop sleeps at now, after a pass or a check that ran
// none: until the end of a failed pass's backoff, not at all while a pass is due at once,
// else every.
func (s maintSchedule) wait(now time.Time, repairAsked bool) time.Duration {
	switch {
	case now.Before(s.after):
		return s.after.Sub(now)
	case s.more || repairAsked:
		return 0
	}
	return s.every
}

// repairs reports whether the current pass runs repairWaiting: once every repairEvery
// passes, and whenever a repair was asked for.
func (s maintSchedule) repairs(repairAsked bool) bool {
	return repairAsked || s.passes%repairEvery == 0
}

// loop runs maybeRun until ctx ends, beside Run's cycles. A pass that marked rows held,
// for its few milliseconds, KEY SHARE locks on the rows they wait for, and a claim
// meanwhile skipped those (SKIP LOCKED): so it wakes the relay for another cycle. (The rows
// a pass locks but does not mark are not heads: a claim that skips them loses nothing.)
func (m *maintenance) loop(ctx context.Context, wake chan<- struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.maybeRun(ctx)
		m.mu.Lock()
		next := m.sched.wait(time.Now(), m.repairNow.Load())
		if m.marked > 0 {
			signal(wake)
		}
		m.mu.Unlock()
		t.Reset(next)
	}
}

// maybeRun runs a pass when one is due (see maintSchedule.due). A failed pass is left to a
// later one, after the outage backoff, and logged once per failure streak.
func (m *maintenance) maybeRun(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if !m.sched.due(now, m.repairNow.Load()) {
		return
	}
	m.sched.last = now
	m.sched.passes++
	m.marked = 0
	pctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	err := m.pass(pctx)
	switch {
	case err == nil:
		m.failures.Succeed(ctx)
	case ctx.Err() == nil: // not the relay stopping
		m.sched.after = time.Now().Add(m.failures.Fail(ctx, err))
	}
}

// pass is one pass of maybeRun: repairWaiting when it is due, then markWaiting. A failed
// repair is due again at the next pass.
func (m *maintenance) pass(ctx context.Context) error {
	if m.sched.repairs(m.repairNow.Swap(false)) {
		if _, err := m.db.Exec(ctx, m.repairWaiting); err != nil {
			m.repairNow.Store(true)
			m.sched.more = false
			return fmt.Errorf("repair waiting rows: %w", err)
		}
	}
	tag, err := m.db.Exec(ctx, m.markWaiting, markWaitingLimit, markWaitingWindow)
	if err != nil {
		m.sched.more = false
		return fmt.Errorf("mark waiting rows: %w", err)
	}
	m.marked = tag.RowsAffected()
	// Only a full pass says that more rows are waiting to be marked: going again at once
	// after every pass that marked one row would run passes back to back while a busy
	// aggregate is being written.
	m.sched.more = m.marked >= markWaitingLimit
	return nil
}

// requestRepair asks the next pass to run repairWaiting, and to run at once. It never
// waits: a cycle calls it with its transaction open.
func (m *maintenance) requestRepair() { m.repairNow.Store(true) }
