package inboxrabbitmq_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// Environment of the child process of TestConsumerCrash.
const (
	crashChildEnv     = "OUTBOXSHOP_INBOX_CRASH_CHILD"
	crashDBEnv        = "OUTBOXSHOP_INBOX_CRASH_DB_URL"
	crashAMQPEnv      = "OUTBOXSHOP_INBOX_CRASH_AMQP_URL"
	crashQueueEnv     = "OUTBOXSHOP_INBOX_CRASH_QUEUE"
	crashDeadEnv      = "OUTBOXSHOP_INBOX_CRASH_DEAD_EXCHANGE"
	crashFailpointEnv = "OUTBOXSHOP_INBOX_CRASH_FAILPOINT"
)

// TestConsumerCrash runs a consumer in a child process (this test binary, re-executed) whose
// failpoint hook SIGKILLs it at a crash point, then checks that a new consumer gets the
// redelivery and the effect happens exactly once.
func TestConsumerCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		failpoint string
		committed bool // whether the effect survived the crash
	}{
		{"AfterCommitBeforeAck", inboxrabbitmq.FailpointAfterCommit, true},
		{"BeforeCommit", inboxrabbitmq.FailpointBeforeCommit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.publish(t, jsonMessage("order-1"))

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(),
				crashChildEnv+"=1",
				crashDBEnv+"="+b.dbURL,
				crashAMQPEnv+"="+b.amqpURL,
				crashQueueEnv+"="+b.top.Queue,
				crashDeadEnv+"="+b.dead.Exchange,
				crashFailpointEnv+"="+tc.failpoint,
			)
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			require.True(t, errors.As(err, &exitErr), "child did not fail: %v\n%s", err, out)
			status, ok := exitErr.Sys().(syscall.WaitStatus)
			require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL,
				"child was not killed at %s: %v\n%s", tc.failpoint, err, out)

			if tc.committed {
				require.Equal(t, 1, b.effects(t, "order-1"), "the commit before the crash is lost")
			} else {
				require.Zero(t, b.effects(t, "order-1"), "an uncommitted change survived the crash")
			}

			// A new consumer gets the redelivery.
			var calls, redelivered atomic.Int64
			stop := b.run(t, b.config(func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
				calls.Add(1)
				if d.Redelivered {
					redelivered.Add(1)
				}
				return recordEffect(ctx, tx, d)
			}))
			testinfra.Eventually(t, 30*time.Second, func() bool {
				processed, duplicates := b.events.counts()
				return processed+duplicates == 1
			}, "the redelivery was not handled")
			stop()

			processed, duplicates := b.events.counts()
			if tc.committed {
				require.Equal(t, 1, duplicates, "the inbox did not report the redelivery as a duplicate")
				require.Zero(t, calls.Load(), "the handler ran again for a committed message")
			} else {
				require.Equal(t, 1, processed)
				require.EqualValues(t, 1, redelivered.Load(), "the broker's redelivered flag was not set")
			}
			require.Equal(t, 1, b.effects(t, "order-1"), "the effect did not happen exactly once")
			testinfra.Eventually(t, 10*time.Second, func() bool {
				messages, _ := b.queueState(t, b.top.Queue)
				return messages == 0
			}, "the message was not acknowledged")
		})
	}
}

// TestCrashChild is the child process of TestConsumerCrash; it is skipped in normal runs.
func TestCrashChild(t *testing.T) {
	t.Parallel()
	if os.Getenv(crashChildEnv) == "" {
		t.Skip("helper process of TestConsumerCrash")
	}
	pool, err := pgxpool.New(context.Background(), os.Getenv(crashDBEnv))
	require.NoError(t, err)
	defer pool.Close()
	target := os.Getenv(crashFailpointEnv)
	c, err := inboxrabbitmq.NewConsumer(pool, inboxrabbitmq.Config{
		URL:                os.Getenv(crashAMQPEnv),
		Queue:              os.Getenv(crashQueueEnv),
		Name:               "orders-projection",
		Handler:            recordEffect,
		DeadLetterExchange: os.Getenv(crashDeadEnv),
		Hooks: inboxrabbitmq.Hooks{Failpoint: func(hit inboxrabbitmq.FailpointHit) {
			if hit.Name == target {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	t.Fatalf("the consumer never reached failpoint %s", target)
}
