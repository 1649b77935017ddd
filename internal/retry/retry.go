// Package retry is how every background loop of this module waits and logs while what it
// needs (the database, the broker) is away: it backs off between attempts, exponentially,
// capped and jittered, and it says a failure once instead of on every attempt.
//
// A loop keeps one [Streak] and calls [Streak.Fail] after each failed attempt (it returns the
// wait before the next) and [Streak.Succeed] after each successful one. The log then holds:
//
//   - one Warn line when the loop starts failing, with the error;
//   - at most one Warn line per [Streak].LogInterval while it goes on failing, with how many
//     attempts failed so far, for how long, and the last error;
//   - one Info line when it succeeds again, with how long it was down.
//
// This is the source of the copies in each library's internal/retry (each library must stay
// copyable alone): edit it here and run go generate; a test in tools fails when a copy drifts.
package retry

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// DefaultLogInterval is how often a loop that goes on failing says so again.
const DefaultLogInterval = 30 * time.Second

// Backoff is the wait between the attempts of a failing loop: Base after the first failure,
// doubled after each further one up to Max, and then between half and all of that ("equal
// jitter"), so that many processes that lost the same server do not retry in step.
type Backoff struct {
	Base, Max time.Duration
}

// Delay returns the wait after the n-th consecutive failure (n counts from 1). A Backoff
// whose Base is zero or negative waits nothing: only a test should want that.
func (b Backoff) Delay(n int) time.Duration {
	d := b.ceiling(n)
	if d <= 1 {
		return max(d, 0)
	}
	return d/2 + rand.N(d/2+1)
}

// ceiling is the n-th delay before jitter.
func (b Backoff) ceiling(n int) time.Duration {
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	return min(d, max(b.Max, b.Base))
}

// MaxAttempts is the most attempts a loop that waits [Backoff.Delay] after each failure can
// make in a window of d that starts with an attempt: the bound the tests of every loop hold
// it to. It assumes every attempt fails at once, and every wait is the shortest the jitter
// allows.
func (b Backoff) MaxAttempts(d time.Duration) int {
	if b.Base <= 0 {
		return -1 // unbounded
	}
	n, spent := 1, time.Duration(0)
	for {
		spent += b.ceiling(n) / 2
		if spent > d {
			return n
		}
		n++
	}
}

// Streak is one loop's run of consecutive failures: what it waits between attempts, and what
// it logs. Set What, Logger and Backoff before the first call; the rest is its state. A Streak
// is safe for concurrent use, though a loop normally has it to itself.
type Streak struct {
	// What names the loop in its log lines, as "outbox relay: mark waiting rows".
	What string
	// Logger receives the lines; nil discards them.
	Logger *slog.Logger
	// Backoff spaces the attempts.
	Backoff Backoff
	// LogInterval is the least time between two lines of one failure streak. Default
	// [DefaultLogInterval].
	LogInterval time.Duration

	mu       sync.Mutex
	failures int       // consecutive failed attempts
	since    time.Time // the first failure of the streak
	logged   time.Time // the last line of the streak
	unlogged int       // failures since that line
	now      func() time.Time
}

// Fail records a failed attempt and returns the wait before the next one. It logs the first
// failure of a streak, and after that at most one line per LogInterval.
func (s *Streak) Fail(ctx context.Context, err error) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.failures++
	s.unlogged++
	switch {
	case s.failures == 1:
		s.since, s.logged, s.unlogged = now, now, 0
		s.logger().WarnContext(ctx, s.What+": failing; retrying with backoff", slog.Any("error", err))
	case now.Sub(s.logged) >= s.interval():
		s.logger().WarnContext(ctx, s.What+": still failing",
			slog.Int("failed_attempts", s.failures), slog.Int("since_last_line", s.unlogged),
			slog.Duration("down_for", now.Sub(s.since).Round(time.Millisecond)), slog.Any("error", err))
		s.logged, s.unlogged = now, 0
	}
	return s.Backoff.Delay(s.failures)
}

// Succeed records a successful attempt. If it ends a streak of failures it logs, once, how
// long the loop was down and how many attempts failed.
func (s *Streak) Succeed(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == 0 {
		return
	}
	s.logger().InfoContext(ctx, s.What+": recovered",
		slog.Int("failed_attempts", s.failures), slog.Duration("down_for", s.clock().Sub(s.since).Round(time.Millisecond)))
	s.failures, s.unlogged = 0, 0
}

// Failures is the number of consecutive failed attempts so far: 0 when the last one succeeded.
func (s *Streak) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures
}

func (s *Streak) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func (s *Streak) interval() time.Duration {
	if s.LogInterval > 0 {
		return s.LogInterval
	}
	return DefaultLogInterval
}

func (s *Streak) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Sleep waits d, or until ctx ends; it reports whether it waited the whole d.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
