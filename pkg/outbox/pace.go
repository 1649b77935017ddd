package outbox

import "time"

// pacer decides, after each of [Relay.Run]'s cycles, when the next one starts. Only Run's
// goroutine uses it.
//
// After a cycle that found rows or that a notification started, the relay looks again
// NotifyRecheck later: for rows behind the ones it just published (the next row of an
// aggregate becomes claimable only once its predecessor's mark committed), and for rows of
// writers that skipped their NOTIFY (see the trigger) and may have become visible only after
// the claim. A re-check that finds rows is followed by another; an empty one doubles the
// delay, until it reaches PollInterval and polling takes over. So a skipped row waits about
// as long again as its commit took, not a poll interval.
type pacer struct {
	batchSize                   int
	pollInterval, notifyRecheck time.Duration
	// idleBackoff is the wait after the n-th cycle in a row that sent nothing (n from 1):
	// the outage backoff, jittered.
	idleBackoff func(n int) time.Duration

	idle     int           // consecutive cycles that claimed rows but sent none of them
	recheck  time.Duration // delay of the next re-check; 0: none due
	notified bool          // a notification started the cycle
}

func (r *Relay) newPacer() *pacer {
	return &pacer{
		batchSize: r.cfg.BatchSize, pollInterval: r.cfg.PollInterval, notifyRecheck: r.cfg.NotifyRecheck,
		idleBackoff: r.cycles.Backoff.Delay,
	}
}

// pause is what Run does before its next cycle.
type pause struct {
	// now: no pause, the next cycle claims at once.
	now bool
	// outage: wait the outage backoff of the cycles' failure streak, which Run keeps.
	outage bool
	// wait is how long to wait otherwise.
	wait time.Duration
	// wakeable: a notification ends the wait.
	wakeable bool
}

// after decides the pause after a cycle that did c, or failed (the broker or the database
// is unavailable). Only step's pipelined continuation (c.more) leaves batches in flight:
// every other pause starts with none, so a pause never holds a claim.
func (p *pacer) after(c cycleResult, failed bool) pause {
	switch {
	case failed:
		// An outage: a notification must not cut its backoff short.
		p.recheck, p.notified = 0, false
		return pause{outage: true}
	case c.more:
		// A full batch is on its way: more rows are likely waiting; claim them now.
		p.idle = 0
		return pause{now: true}
	case c.claimed > 0 && c.settled == 0:
		// Rows were claimed but none was published or failed: the publisher sent nothing,
		// or the broker refused everything. Not an outage, but going round again at once
		// would only repeat it: the outage backoff too.
		p.idle++
		p.recheck, p.notified = 0, false
		return pause{wait: p.idleBackoff(p.idle)}
	case c.last == p.batchSize:
		p.idle = 0
		return pause{now: true} // a full batch: more rows are likely waiting
	}
	p.idle = 0
	switch {
	case p.notified || c.claimed > 0 || c.last > 0:
		p.recheck = p.notifyRecheck
	case p.recheck > 0:
		p.recheck *= 2
	}
	p.notified = false
	if p.recheck > 0 && p.recheck < p.pollInterval {
		return pause{wait: p.recheck, wakeable: true}
	}
	p.recheck = 0
	return pause{wait: p.pollInterval, wakeable: true}
}

// woken records that a notification ended the pause: the next cycle was started by it.
func (p *pacer) woken() { p.notified = true }
