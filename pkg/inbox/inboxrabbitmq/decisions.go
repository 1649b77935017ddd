package inboxrabbitmq

import (
	"time"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/retry"
)

// The consumer's decisions about a delivery, apart from the I/O that carries them out, so
// that they are tested without a broker. What is refused before a transaction, and what
// follows a failed attempt, are decided in package decide (internal/decide), which
// rabbitmqtest shares.

// outlastsHold reports whether waiting delay before the next retry in place of a held
// delivery, which arrived sinceArrival ago, would hold it past maxHold: then it is handed
// back instead. A wait that ends exactly at maxHold is still taken.
func outlastsHold(sinceArrival, delay, maxHold time.Duration) bool {
	return sinceArrival+delay > maxHold
}

// handBackWay decides how a delivery that the consumer cannot finish goes back to the
// broker. It returns the hand-back reason when an uncounted copy can be republished:
// HandBackShutdown when the consumer is stopping, HandBackHoldLimit when the delivery was
// held for MaxHold. It returns HandBackRequeued when only a reject with requeue (or the
// closed channel) is left, which the broker counts: after workEnded (ShutdownTimeout passed
// on a stop, and in-flight work was cancelled), or after the session ended without a stop
// (the connection is lost, nothing can be published on it).
func handBackWay(stopping, sessionEnded, workEnded bool) string {
	switch {
	case workEnded:
		return HandBackRequeued
	case stopping:
		return HandBackShutdown
	case sessionEnded:
		return HandBackRequeued
	default:
		return HandBackHoldLimit
	}
}

// retryBackoff spaces the counted retries of a message: RetryBaseDelay doubling per attempt
// up to RetryMaxDelay, jittered. One wait per counted attempt, at most MaxDeliveries per
// message.
func (c *Consumer) retryBackoff() retry.Backoff {
	return retry.Backoff{Base: c.cfg.RetryBaseDelay, Max: c.cfg.RetryMaxDelay}
}

// retryDelay is the wait before publishing the retry copy of the n-th attempt (n counts
// from 1).
func (c *Consumer) retryDelay(n int) time.Duration { return c.retryBackoff().Delay(n) }

// holdBackoff spaces the retries in place of a held delivery: the retry backoff, at most a
// quarter of MaxHold (and starting at most at an eighth), so that a hold retries several
// times before its delivery is handed back, and a hand-back never follows its arrival at
// once.
func (c *Consumer) holdBackoff() retry.Backoff {
	limit := min(c.cfg.RetryMaxDelay, c.cfg.MaxHold/4)
	return retry.Backoff{Base: min(c.cfg.RetryBaseDelay, c.cfg.MaxHold/8, limit), Max: limit}
}

// holdDelay is the wait before the n-th retry in place of a held delivery (n counts from 1).
func (c *Consumer) holdDelay(n int) time.Duration { return c.holdBackoff().Delay(n) }
