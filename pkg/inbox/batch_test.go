package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

// batchHandler is the fn of a batch: it records an effects row for each message it handles
// and remembers the indexes it was called with in the last attempt at the batch (the last
// transaction it saw), and how many attempts there were. Handle lets a test replace the
// body for some messages; it runs after the effect was written, so a failure must roll it
// back.
type batchHandler struct {
	consumer string
	msgs     []inbox.Message
	called   []int
	attempts int
	tx       pgx.Tx
	handle   func(ctx context.Context, tx pgx.Tx, i int) error
}

func (h *batchHandler) fn(ctx context.Context, tx pgx.Tx, i int) error {
	if tx != h.tx {
		h.tx, h.called = tx, nil
		h.attempts++
	}
	h.called = append(h.called, i)
	if err := recordEffect(h.consumer, h.msgs[i].ID)(ctx, tx); err != nil {
		return err
	}
	if h.handle != nil {
		return h.handle(ctx, tx, i)
	}
	return nil
}

// messages returns a message of type order.placed for each id.
func messages(ids ...string) []inbox.Message {
	msgs := make([]inbox.Message, len(ids))
	for i, id := range ids {
		msgs[i] = inbox.Message{ID: id, Type: "order.placed"}
	}
	return msgs
}

// errBeginner fails every Begin with err.
type errBeginner struct{ err error }

func (b errBeginner) Begin(context.Context) (pgx.Tx, error) { return nil, b.err }

// cancelAfterCommit is a pgx tracer that, once armed, cancels a context right after a
// COMMIT succeeded: the transaction is committed, but its caller finds its context ended.
type cancelAfterCommit struct {
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (c *cancelAfterCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *cancelAfterCommit) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil && data.CommandTag.String() == "COMMIT" && c.armed.Load() {
		c.cancel()
	}
}

// statementLog is a pgx tracer that records the SQL of every statement sent.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.add(data.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	l.add(data.SQL)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

func (l *statementLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = nil
}

func (l *statementLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sql)
}

// count returns how many statements began with prefix.
func (l *statementLog) count(prefix string) int {
	n := 0
	for _, sql := range l.all() {
		if strings.HasPrefix(strings.TrimSpace(sql), prefix) {
			n++
		}
	}
	return n
}

// tracedPool returns a pool on a fresh database with the inbox and an effects table, whose
// connections report to tracer.
func tracedPool(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testinfra.DatabaseURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, inbox.Migrate(t.Context(), pool))
	_, err = pool.Exec(t.Context(), `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	return pool
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()

	type bundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) (context.Context, *bundle) {
		t.Helper()
		return t.Context(), &bundle{pool: newMigratedPool(t)}
	}
	effects := func(t *testing.T, pool *pgxpool.Pool, id string) int {
		t.Helper()
		return countRows(t, pool, `SELECT count(*) FROM effects WHERE message_id = $1`, id)
	}
	inboxRows := func(t *testing.T, pool *pgxpool.Pool, id string) int {
		t.Helper()
		return countRows(t, pool, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, id)
	}
	// requireNothingCommitted checks that a failed batch left no inbox row and no effect.
	requireNothingCommitted := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		require.Zero(t, countRows(t, pool, `SELECT count(*) FROM inbox_messages`), "inbox rows committed")
		require.Zero(t, countRows(t, pool, `SELECT count(*) FROM effects`), "effects committed")
	}

	t.Run("NewMessagesRunFnOnceEachAndCommitTogether", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		received := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
		msgs := []inbox.Message{
			{ID: "m-1", Type: "order.placed", ReceivedAt: received},
			{ID: "m-2", Type: "order.paid"},
			{ID: "m-3"},
		}
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(ctx context.Context, _ pgx.Tx, i int) error {
			if i == len(msgs)-1 {
				// Another connection sees nothing yet: one commit for all, at the end.
				require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM effects`))
				require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
			}
			return nil
		}
		before := time.Now()

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}, {}}, results)
		require.Equal(t, []int{0, 1, 2}, h.called)
		require.Equal(t, 1, h.attempts, "a batch in which nothing failed ran twice")
		for _, msg := range msgs {
			require.Equal(t, 1, effects(t, b.pool, msg.ID), msg.ID)
		}

		rows, err := b.pool.Query(ctx, `SELECT message_id, message_type, received_at, processed_at
			FROM inbox_messages WHERE consumer = 'billing' ORDER BY message_id`)
		require.NoError(t, err)
		type row struct {
			ID, Type                string
			ReceivedAt, ProcessedAt time.Time
		}
		stored, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		require.Len(t, stored, 3)
		for i, r := range stored {
			require.Equal(t, msgs[i].ID, r.ID)
			require.Equal(t, msgs[i].Type, r.Type)
			require.WithinDuration(t, time.Now(), r.ProcessedAt, time.Minute)
		}
		require.True(t, received.Equal(stored[0].ReceivedAt), "received_at %s, want %s", stored[0].ReceivedAt, received)
		for _, r := range stored[1:] {
			// A zero ReceivedAt means now; microseconds, as PostgreSQL stores them.
			require.False(t, r.ReceivedAt.Before(before.Truncate(time.Microsecond)), "received_at %s before the batch", r.ReceivedAt)
			require.WithinDuration(t, time.Now(), r.ReceivedAt, time.Minute)
		}
	})

	t.Run("NilFnRecordsTheMessages", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", messages("m-1", "m-2"), nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}}, results)
		results, err = inbox.ProcessBatch(ctx, b.pool, "billing", messages("m-1", "m-2"), nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{Duplicate: true}, {Duplicate: true}}, results)
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("FnGetsTheBatchContext", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		type key struct{}
		ctx = context.WithValue(ctx, key{}, "batch-7")

		var seen []any
		_, err := inbox.ProcessBatch(ctx, b.pool, "billing", messages("m-1", "m-2"), func(ctx context.Context, _ pgx.Tx, _ int) error {
			seen = append(seen, ctx.Value(key{}))
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []any{"batch-7", "batch-7"}, seen)
	})

	t.Run("MessageProcessedBeforeIsADuplicate", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		dup, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: "m-2"}, recordEffect("billing", "m-2"))
		require.NoError(t, err)
		require.False(t, dup)

		msgs := messages("m-1", "m-2", "m-3")
		h := &batchHandler{consumer: "billing", msgs: msgs}
		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {Duplicate: true}, {}}, results)
		require.Equal(t, []int{0, 2}, h.called, "fn ran for a duplicate")
		for _, id := range []string{"m-1", "m-2", "m-3"} {
			require.Equal(t, 1, effects(t, b.pool, id), id)
			require.Equal(t, 1, inboxRows(t, b.pool, id), id)
		}

		// Another consumer has not seen any of them.
		results, err = inbox.ProcessBatch(ctx, b.pool, "shipping", msgs, nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}, {}}, results)
	})

	t.Run("SameIDTwiceInOneBatchIsProcessedOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msgs := messages("m-1", "m-2", "m-1")
		h := &batchHandler{consumer: "billing", msgs: msgs}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}, {Duplicate: true}}, results)
		require.Equal(t, []int{0, 1}, h.called)
		require.Equal(t, 1, effects(t, b.pool, "m-1"))
		require.Equal(t, 1, inboxRows(t, b.pool, "m-1"))
	})

	t.Run("SameIDAfterAFailedOneRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msgs := messages("m-1", "m-1", "m-1")
		boom := errors.New("boom")
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(_ context.Context, _ pgx.Tx, i int) error {
			if i == 0 {
				return boom
			}
			return nil
		}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Len(t, results, 3)
		require.ErrorIs(t, results[0].Err, boom)
		require.False(t, results[0].Duplicate)
		require.Equal(t, inbox.Result{}, results[1], "the first failed: the second is not its duplicate")
		require.Equal(t, inbox.Result{Duplicate: true}, results[2], "the second succeeded: the third is its duplicate")
		require.Equal(t, []int{0, 1}, h.called)
		require.Equal(t, 1, effects(t, b.pool, "m-1"))
		require.Equal(t, 1, inboxRows(t, b.pool, "m-1"))
	})

	t.Run("FailingFnRollsBackOnlyItsMessage", func(t *testing.T) {
		t.Parallel()
		base := errors.New("unknown product")
		for name, tc := range map[string]struct {
			err  error
			want inbox.Class
		}{
			"Plain":     {base, inbox.ClassFailed},
			"Permanent": {fmt.Errorf("reserve stock: %w", inbox.Permanent(base)), inbox.ClassPermanent},
			"Transient": {inbox.Transient(base), inbox.ClassTransient},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, b := setup(t)
				msgs := messages("m-1", "m-2", "m-3")
				h := &batchHandler{consumer: "billing", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					switch i {
					case 1:
						// Write more than the effect, then fail: all of it goes.
						if _, err := tx.Exec(ctx, `CREATE TABLE m2_scratch (id int)`); err != nil {
							return err
						}
						return tc.err
					case 2:
						// What the message before wrote is gone already, and so is its inbox row.
						var n int
						err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM effects WHERE message_id = 'm-2')
							+ (SELECT count(*) FROM inbox_messages WHERE message_id = 'm-2')`).Scan(&n)
						if err != nil {
							return err
						}
						if n != 0 {
							return fmt.Errorf("m-3 sees %d rows of the failed m-2", n)
						}
					}
					return nil
				}

				results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
				require.NoError(t, err)
				require.Len(t, results, 3)
				require.Equal(t, inbox.Result{}, results[0])
				require.Equal(t, inbox.Result{}, results[2])
				require.False(t, results[1].Duplicate)
				require.ErrorIs(t, results[1].Err, base)
				require.ErrorContains(t, results[1].Err, `message "m-2"`)
				require.Equal(t, tc.want, inbox.Classify(results[1].Err), "%v", results[1].Err)
				require.Equal(t, []int{0, 1, 2}, h.called)
				require.Equal(t, 2, h.attempts, "the first attempt, rolled back, and the one with savepoints")

				require.Equal(t, 1, effects(t, b.pool, "m-1"))
				require.Zero(t, effects(t, b.pool, "m-2"), "the failed message's effect was committed")
				require.Equal(t, 1, effects(t, b.pool, "m-3"))
				require.Equal(t, 1, inboxRows(t, b.pool, "m-1"))
				require.Zero(t, inboxRows(t, b.pool, "m-2"), "the failed message's inbox row was committed")
				require.Equal(t, 1, inboxRows(t, b.pool, "m-3"))
				require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'm2_scratch'`))

				// Its redelivery is new.
				results, err = inbox.ProcessBatch(ctx, b.pool, "billing", msgs[1:2], (&batchHandler{consumer: "billing", msgs: msgs[1:2]}).fn)
				require.NoError(t, err)
				require.Equal(t, []inbox.Result{{}}, results)
				require.Equal(t, 1, effects(t, b.pool, "m-2"))
			})
		}
	})

	t.Run("FailedStatementIsRolledBackToTheSavepoint", func(t *testing.T) {
		t.Parallel()
		// Each fn leaves the transaction aborted and returns the statement's error.
		for name, tc := range map[string]struct {
			sql  string
			code string
			want inbox.Class
		}{
			"UndefinedTable":       {`INSERT INTO no_such_table VALUES (1)`, "42P01", inbox.ClassFailed},
			"UniqueViolation":      {`INSERT INTO skus (sku) VALUES ('taken')`, "23505", inbox.ClassFailed},
			"DivisionByZero":       {`SELECT 1 / 0`, "22012", inbox.ClassFailed},
			"SerializationFailure": {`DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = 'serialization_failure'; END $$`, "40001", inbox.ClassTransient},
			"LockNotAvailable":     {`DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = 'lock_not_available'; END $$`, "55P03", inbox.ClassTransient},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, b := setup(t)
				_, err := b.pool.Exec(ctx, `CREATE TABLE skus (sku text PRIMARY KEY); INSERT INTO skus VALUES ('taken')`)
				require.NoError(t, err)
				msgs := messages("m-1", "m-2", "m-3")
				h := &batchHandler{consumer: "billing", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					if i != 1 {
						return nil
					}
					_, err := tx.Exec(ctx, tc.sql)
					return err
				}

				results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
				require.NoError(t, err)
				require.Len(t, results, 3)
				require.Equal(t, inbox.Result{}, results[0])
				require.Equal(t, inbox.Result{}, results[2])
				var pgErr *pgconn.PgError
				require.ErrorAs(t, results[1].Err, &pgErr)
				require.Equal(t, tc.code, pgErr.Code)
				require.Equal(t, tc.want, inbox.Classify(results[1].Err), "%v", results[1].Err)
				require.Equal(t, 1, effects(t, b.pool, "m-1"))
				require.Zero(t, effects(t, b.pool, "m-2"))
				require.Equal(t, 1, effects(t, b.pool, "m-3"))
				require.Zero(t, inboxRows(t, b.pool, "m-2"))
				require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
			})
		}
	})

	t.Run("StatementErrorInsideFnsOwnSavepointIsRecovered", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msgs := messages("m-1", "m-2")
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(ctx context.Context, tx pgx.Tx, _ int) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil {
				return errors.New("the insert into a missing table succeeded")
			}
			return sp.Rollback(ctx)
		}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}}, results)
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM effects`))
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("FnThatHidesAFailedStatementFailsTheBatch", func(t *testing.T) {
		t.Parallel()
		// fn must not leave tx failed. One that does, and returns nil, fails the next
		// message's savepoint or the commit: the whole batch, and nothing is committed.
		for name, culprit := range map[string]int{"BeforeAnotherMessage": 1, "LastMessage": 2} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, b := setup(t)
				msgs := messages("m-1", "m-2", "m-3")
				h := &batchHandler{consumer: "billing", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					if i == culprit {
						_, _ = tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
					}
					return nil
				}

				results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
				require.Error(t, err)
				require.Nil(t, results)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "25P02", pgErr.Code) // in_failed_sql_transaction
				require.False(t, inbox.IsTransient(err), "%v", err)
				requireNothingCommitted(t, b.pool)
			})
		}
	})

	t.Run("LaterMessagesSeeWhatEarlierOnesWrote", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		_, err := b.pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL)`)
		require.NoError(t, err)
		msgs := messages("m-1", "m-2", "m-3")
		var seen []int
		results, err := inbox.ProcessBatch(ctx, b.pool, "stock", msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
			var reserved int
			err := tx.QueryRow(ctx, `INSERT INTO stock VALUES ('sku-1', 1)
				ON CONFLICT (sku) DO UPDATE SET reserved = stock.reserved + 1 RETURNING reserved`).Scan(&reserved)
			if err != nil {
				return err
			}
			seen = append(seen, reserved)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}, {}}, results)
		require.Equal(t, []int{1, 2, 3}, seen)
		require.Equal(t, 3, countRows(t, b.pool, `SELECT reserved FROM stock`))
	})

	t.Run("InvalidMessagesFailAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msgs := []inbox.Message{
			{ID: "m-1"},
			{ID: ""},
			{ID: "k\xff\xfe"},
			{ID: "m\x004"},
			{ID: "m-5", Type: "\xc3("},
			{ID: "m-6"},
		}
		h := &batchHandler{consumer: "billing", msgs: msgs}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Len(t, results, len(msgs))
		require.Equal(t, []int{0, 5}, h.called, "fn ran for an invalid message, or with a shifted index")
		require.Equal(t, inbox.Result{}, results[0])
		require.Equal(t, inbox.Result{}, results[5])
		for i, want := range map[int]error{
			1: inbox.ErrNoMessageID,
			2: inbox.ErrInvalidMessageID,
			3: inbox.ErrInvalidMessageID,
			4: inbox.ErrInvalidMessageType,
		} {
			require.ErrorIs(t, results[i].Err, want, "message %d", i)
			require.True(t, inbox.IsPermanent(results[i].Err), "message %d: %v", i, results[i].Err)
			require.False(t, results[i].Duplicate)
		}
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM effects`))
		require.Zero(t, inboxRows(t, b.pool, "m-5"))
	})

	t.Run("RefusedInboxRowFailsItsMessageAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		// The inbox's own insert fails for two messages: the value's fault (class 22) is
		// permanent, anything else transient, whatever Classify says of the SQLSTATE alone.
		_, err := b.pool.Exec(ctx, `
			CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.message_id = 'm-denied' THEN
					RAISE EXCEPTION 'denied' USING ERRCODE = 'insufficient_privilege';
				ELSIF NEW.message_id = 'm-bad' THEN
					RAISE EXCEPTION 'bad value' USING ERRCODE = 'invalid_parameter_value';
				END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER refuse BEFORE INSERT ON inbox_messages FOR EACH ROW EXECUTE FUNCTION refuse()`)
		require.NoError(t, err)
		msgs := messages("m-1", "m-denied", "m-bad", "m-4")
		h := &batchHandler{consumer: "billing", msgs: msgs}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Len(t, results, 4)
		require.Equal(t, []int{0, 3}, h.called)
		require.Equal(t, inbox.Result{}, results[0])
		require.Equal(t, inbox.Result{}, results[3])
		var pgErr *pgconn.PgError
		require.ErrorAs(t, results[1].Err, &pgErr)
		require.Equal(t, "42501", pgErr.Code)
		require.ErrorContains(t, results[1].Err, `message "m-denied"`)
		require.True(t, inbox.IsTransient(results[1].Err), "%v", results[1].Err)
		require.ErrorAs(t, results[2].Err, &pgErr)
		require.Equal(t, "22023", pgErr.Code)
		require.True(t, inbox.IsPermanent(results[2].Err), "%v", results[2].Err)
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM effects`))

		// A LATIN1 database cannot store the euro sign that Validate lets through.
		latin1 := latin1Pool(t)
		require.NoError(t, inbox.Migrate(ctx, latin1))
		results, err = inbox.ProcessBatch(ctx, latin1, "billing", messages("eur-1", "price-in-€", "eur-3"), nil)
		require.NoError(t, err)
		require.Len(t, results, 3)
		require.Equal(t, inbox.Result{}, results[0])
		require.Equal(t, inbox.Result{}, results[2])
		require.ErrorAs(t, results[1].Err, &pgErr)
		require.Equal(t, "22P05", pgErr.Code) // untranslatable_character
		require.True(t, inbox.IsPermanent(results[1].Err), "%v", results[1].Err)
		require.Equal(t, 2, countRows(t, latin1, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("InvalidConsumerBeginsNothing", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		fn := func(context.Context, pgx.Tx, int) error {
			t.Error("fn called for an invalid consumer")
			return nil
		}
		for consumer, want := range map[string]error{
			"":            inbox.ErrNoConsumer,
			"bill\x00ing": inbox.ErrInvalidConsumer,
			"bill\xff":    inbox.ErrInvalidConsumer,
		} {
			results, err := inbox.ProcessBatch(ctx, failingBeginner{t}, consumer, messages("m-1"), fn)
			require.ErrorIs(t, err, want, "%q", consumer)
			require.Nil(t, results)
		}
	})

	t.Run("TooManyOrNoMessagesBeginNothing", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		fn := func(context.Context, pgx.Tx, int) error {
			t.Error("fn called")
			return nil
		}
		tooMany := make([]inbox.Message, inbox.MaxBatch+1)
		for i := range tooMany {
			tooMany[i] = inbox.Message{ID: fmt.Sprintf("m-%d", i)}
		}
		results, err := inbox.ProcessBatch(ctx, failingBeginner{t}, "billing", tooMany, fn)
		require.ErrorContains(t, err, "MaxBatch")
		require.Nil(t, results)

		for _, empty := range [][]inbox.Message{nil, {}} {
			results, err = inbox.ProcessBatch(ctx, failingBeginner{t}, "billing", empty, fn)
			require.NoError(t, err)
			require.Empty(t, results)
		}
	})

	t.Run("FullBatch", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		msgs := make([]inbox.Message, inbox.MaxBatch)
		for i := range msgs {
			msgs[i] = inbox.Message{ID: fmt.Sprintf("m-%d", i)}
		}
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(_ context.Context, _ pgx.Tx, i int) error {
			if i == inbox.MaxBatch-1 {
				return errors.New("the last one fails")
			}
			return nil
		}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Len(t, results, inbox.MaxBatch)
		for _, r := range results[:inbox.MaxBatch-1] {
			require.Equal(t, inbox.Result{}, r)
		}
		require.Error(t, results[inbox.MaxBatch-1].Err)
		require.Equal(t, inbox.MaxBatch-1, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		require.Equal(t, inbox.MaxBatch-1, countRows(t, b.pool, `SELECT count(*) FROM effects`))
	})

	t.Run("FailedBeginIsTransient", func(t *testing.T) {
		t.Parallel()
		noConn := errors.New("no connection to the database")
		results, err := inbox.ProcessBatch(t.Context(), errBeginner{noConn}, "billing", messages("m-1"), nil)
		require.ErrorIs(t, err, noConn)
		require.ErrorContains(t, err, "begin")
		require.True(t, inbox.IsTransient(err), "%v", err)
		require.Nil(t, results)

		// And with a server that is gone.
		ctx := t.Context()
		dbURL := testinfra.DatabaseURL(t)
		proxy := testinfra.NewProxy(t, hostPort(t, dbURL))
		pool, err := pgxpool.New(ctx, proxy.RewriteURL(t, dbURL))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		require.NoError(t, inbox.Migrate(ctx, pool))
		proxy.Cut()
		results, err = inbox.ProcessBatch(ctx, pool, "billing", messages("m-1"), nil)
		require.ErrorContains(t, err, "begin")
		require.True(t, inbox.IsTransient(err), "%v", err)
		require.Nil(t, results)
	})

	t.Run("LostConnectionFailsTheWholeBatch", func(t *testing.T) {
		t.Parallel()
		// Each case kills the batch's backend at some point of the fn of message culprit.
		type killer func(ctx context.Context, t *testing.T, b *bundle, tx pgx.Tx) error
		selfTerminate := func(ctx context.Context, _ *testing.T, _ *bundle, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			if err == nil {
				return errors.New("the backend survived its termination")
			}
			return err
		}
		terminateFromOutside := func(ctx context.Context, t *testing.T, b *bundle, tx pgx.Tx) error {
			var pid uint32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			var ok bool
			// Waits until the backend is gone.
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ok))
			require.True(t, ok)
			return nil
		}
		for name, tc := range map[string]struct {
			culprit int
			kill    killer
			swallow bool
		}{
			"FnReturnsTheError":         {culprit: 1, kill: selfTerminate},
			"FnSwallowsTheError":        {culprit: 1, kill: selfTerminate, swallow: true},
			"LastFnSwallowsTheError":    {culprit: 2, kill: selfTerminate, swallow: true},
			"TerminatedBetweenMessages": {culprit: 1, kill: terminateFromOutside},
			"TerminatedBeforeTheCommit": {culprit: 2, kill: terminateFromOutside},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, b := setup(t)
				msgs := messages("m-1", "m-2", "m-3")
				h := &batchHandler{consumer: "billing", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					if i != tc.culprit {
						return nil
					}
					err := tc.kill(ctx, t, b, tx)
					if tc.swallow {
						return nil
					}
					return err
				}

				results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
				require.Error(t, err)
				require.Nil(t, results)
				require.True(t, inbox.IsTransient(err), "%v", err)
				requireNothingCommitted(t, b.pool)

				// The pool recovers: the redelivery commits all three.
				results, err = inbox.ProcessBatch(ctx, b.pool, "billing", msgs, (&batchHandler{consumer: "billing", msgs: msgs}).fn)
				require.NoError(t, err)
				require.Equal(t, []inbox.Result{{}, {}, {}}, results)
				require.Equal(t, 3, countRows(t, b.pool, `SELECT count(*) FROM effects`))
			})
		}
	})

	t.Run("DeferredConstraintFailsTheCommit", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		_, err := b.pool.Exec(ctx, `CREATE TABLE reservations (sku text UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		msgs := messages("m-1", "m-2", "m-3")
		newHandler := func() *batchHandler {
			h := &batchHandler{consumer: "billing", msgs: msgs}
			h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
				if msgs[i].ID != "m-2" {
					return nil
				}
				// Checked at commit only: fn succeeds.
				_, err := tx.Exec(ctx, `INSERT INTO reservations (sku) VALUES ('a'), ('a')`)
				return err
			}
			return h
		}

		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, newHandler().fn)
		require.ErrorContains(t, err, "commit")
		require.Nil(t, results)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code)
		require.Equal(t, inbox.ClassFailed, inbox.Classify(err), "%v", err)
		requireNothingCommitted(t, b.pool)

		// One by one, Process finds the message at fault.
		h := newHandler()
		for i, msg := range msgs {
			_, err := inbox.Process(ctx, b.pool, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
				return h.fn(ctx, tx, i)
			})
			if msg.ID == "m-2" {
				require.ErrorContains(t, err, "commit")
			} else {
				require.NoError(t, err, msg.ID)
			}
		}
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		require.Zero(t, inboxRows(t, b.pool, "m-2"))
	})

	t.Run("CommitOfUnknownOutcomeIsTransient", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		tracer := &cancelAfterCommit{cancel: cancel}
		pool := tracedPool(t, tracer)
		msgs := messages("m-1", "m-2")

		tracer.armed.Store(true)
		results, err := inbox.ProcessBatch(ctx, pool, "billing", msgs, (&batchHandler{consumer: "billing", msgs: msgs}).fn)
		tracer.armed.Store(false)
		require.ErrorIs(t, err, inbox.ErrCommitUnknown)
		require.True(t, inbox.IsTransient(err), "%v", err)
		require.Nil(t, results)

		// Here the commit happened: the redelivery finds it through the inbox.
		h := &batchHandler{consumer: "billing", msgs: msgs}
		results, err = inbox.ProcessBatch(t.Context(), pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{Duplicate: true}, {Duplicate: true}}, results)
		require.Empty(t, h.called)
		require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM effects`))
	})

	t.Run("SavepointsOnlyAfterAFailure", func(t *testing.T) {
		t.Parallel()
		tracer := &statementLog{}
		pool := tracedPool(t, tracer)

		// Nothing fails: three round trips for the batch: the begin, one insert for all
		// its messages, no savepoint, the commit with its replication barrier.
		msgs := messages("m-1", "m-2", "m-3", "m-4")
		tracer.reset()
		results, err := inbox.ProcessBatch(t.Context(), pool, "billing", msgs, nil)
		require.NoError(t, err)
		require.Equal(t, make([]inbox.Result, 4), results)
		sent := tracer.all()
		require.Len(t, sent, 3, "%q", sent)
		require.Equal(t, "begin", sent[0])
		require.True(t, strings.HasPrefix(sent[1], "INSERT INTO"), "%q", sent)
		require.True(t, strings.HasSuffix(sent[2], "COMMIT") && strings.Contains(sent[2], "inbox.replicated"), "%q", sent)

		// One fails: the batch again, a savepoint per message.
		msgs = messages("m-5", "m-6", "m-7")
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(_ context.Context, _ pgx.Tx, i int) error {
			if i == 2 {
				return errors.New("boom")
			}
			return nil
		}
		tracer.reset()
		results, err = inbox.ProcessBatch(t.Context(), pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.Error(t, results[2].Err)
		require.Equal(t, 3, tracer.count("SAVEPOINT inbox_batch_"), "%q", tracer.all())
		require.Equal(t, 1, tracer.count("ROLLBACK TO SAVEPOINT"), "%q", tracer.all())
		require.Equal(t, []int{0, 1, 2}, h.called)
		require.Equal(t, 2, h.attempts)
		require.Equal(t, 2, countRows(t, pool, `SELECT count(*) FROM effects`))
	})

	t.Run("ABatchsOnlyValidMessageFailsInOneAttempt", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		// Nothing else in the batch could commit: its failure is the batch's outcome at
		// once, with the class its error has, and fn runs once.
		msgs := []inbox.Message{{ID: ""}, {ID: "m-1"}}
		h := &batchHandler{consumer: "billing", msgs: msgs}
		h.handle = func(context.Context, pgx.Tx, int) error { return inbox.Permanent(errors.New("unknown product")) }
		results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
		require.NoError(t, err)
		require.ErrorIs(t, results[0].Err, inbox.ErrNoMessageID)
		require.ErrorContains(t, results[1].Err, `handle message "m-1": unknown product`)
		require.Equal(t, inbox.ClassPermanent, inbox.Classify(results[1].Err))
		require.Equal(t, 1, h.attempts)
		require.Equal(t, []int{1}, h.called)
		requireNothingCommitted(t, b.pool)

		// A refused inbox row is classed as Process classes it: the value's fault (class 22)
		// permanent, anything else transient.
		_, err = b.pool.Exec(ctx, `
			CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.message_id = 'm-bad' THEN
					RAISE EXCEPTION 'bad value' USING ERRCODE = 'invalid_parameter_value';
				END IF;
				RAISE EXCEPTION 'denied' USING ERRCODE = 'insufficient_privilege';
			END $$;
			CREATE TRIGGER refuse BEFORE INSERT ON inbox_messages FOR EACH ROW EXECUTE FUNCTION refuse()`)
		require.NoError(t, err)
		for id, want := range map[string]inbox.Class{"m-bad": inbox.ClassPermanent, "m-denied": inbox.ClassTransient} {
			results, err = inbox.ProcessBatch(ctx, b.pool, "billing", []inbox.Message{{ID: id}}, nil)
			require.NoError(t, err)
			require.ErrorContains(t, results[0].Err, fmt.Sprintf("record message %q", id))
			require.Equal(t, want, inbox.Classify(results[0].Err), "%v", results[0].Err)
		}
	})

	t.Run("RedeliveriesInAnotherOrderDoNotDeadlock", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		// Two batches of the same messages in opposite orders, again and again: their inbox
		// rows are inserted in one order, so one waits for the other and then finds
		// duplicates, where inserting in message order would deadlock. A trigger slows each
		// row's insert, so that the two inserts run at the same time.
		_, err := b.pool.Exec(ctx, `
			CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$;
			CREATE TRIGGER slow_insert BEFORE INSERT ON inbox_messages FOR EACH ROW EXECUTE FUNCTION slow_insert()`)
		require.NoError(t, err)
		for round := range 20 {
			ids := make([]string, 8)
			for i := range ids {
				ids[i] = fmt.Sprintf("r%d-m%d", round, i)
			}
			reversed := make([]string, len(ids))
			for i, id := range ids {
				reversed[len(ids)-1-i] = id
			}
			var (
				wg      sync.WaitGroup
				applied atomic.Int64
			)
			for _, order := range [][]string{ids, reversed} {
				wg.Go(func() {
					msgs := messages(order...)
					results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, func(ctx context.Context, tx pgx.Tx, i int) error {
						// Hold the rows a while, so that the other batch comes to them.
						if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`); err != nil {
							return err
						}
						return recordEffect("billing", msgs[i].ID)(ctx, tx)
					})
					if !assert.NoError(t, err) {
						return
					}
					for i, r := range results {
						assert.NoError(t, r.Err, "round %d, %s", round, msgs[i].ID)
						if r.Err == nil && !r.Duplicate {
							applied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			require.EqualValues(t, len(ids), applied.Load(), "round %d", round)
		}
		require.Equal(t, 20*8, countRows(t, b.pool, `SELECT count(*) FROM effects`))
	})

	t.Run("CancelledContextCommitsNothing", func(t *testing.T) {
		t.Parallel()
		// Each case cancels the batch's ctx in the fn of message 1 of 3 (2 of 3 for Last).
		for name, tc := range map[string]struct {
			culprit int
			fn      func(ctx context.Context, cancel context.CancelFunc, tx pgx.Tx, watcher *pgx.Conn) error
		}{
			"FnReturnsTheCancellation": {1, func(ctx context.Context, cancel context.CancelFunc, _ pgx.Tx, _ *pgx.Conn) error {
				cancel()
				return ctx.Err()
			}},
			"FnIgnoresTheCancellation": {1, func(_ context.Context, cancel context.CancelFunc, _ pgx.Tx, _ *pgx.Conn) error {
				cancel()
				return nil
			}},
			"LastFnIgnoresTheCancellation": {2, func(_ context.Context, cancel context.CancelFunc, _ pgx.Tx, _ *pgx.Conn) error {
				cancel()
				return nil
			}},
			"CancelledDuringAStatement": {1, func(ctx context.Context, cancel context.CancelFunc, tx pgx.Tx, watcher *pgx.Conn) error {
				var pid uint32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				// Cancel once the backend sleeps, so that the cancellation hits a running
				// statement.
				var wg sync.WaitGroup
				defer wg.Wait()
				wg.Go(func() {
					defer cancel()
					tick := time.NewTicker(10 * time.Millisecond)
					defer tick.Stop()
					deadline := time.Now().Add(30 * time.Second)
					for time.Now().Before(deadline) {
						var sleeping bool
						err := watcher.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
							WHERE pid = $1 AND wait_event = 'PgSleep')`, pid).Scan(&sleeping)
						if err != nil || sleeping {
							return
						}
						<-tick.C
					}
				})
				_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
				return err
			}},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				dbURL := testinfra.DatabaseURL(t)
				cfg, err := pgxpool.ParseConfig(dbURL)
				require.NoError(t, err)
				cfg.MaxConns = 1
				pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				require.NoError(t, inbox.Migrate(t.Context(), pool))
				_, err = pool.Exec(t.Context(), `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
				require.NoError(t, err)
				watcher, err := pgx.Connect(t.Context(), dbURL)
				require.NoError(t, err)
				t.Cleanup(func() { _ = watcher.Close(context.Background()) })

				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				msgs := messages("m-1", "m-2", "m-3")
				h := &batchHandler{consumer: "billing", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					if i != tc.culprit {
						return nil
					}
					return tc.fn(ctx, cancel, tx, watcher)
				}

				results, err := inbox.ProcessBatch(ctx, pool, "billing", msgs, h.fn)
				require.Error(t, err)
				require.Nil(t, results)

				// The single pooled connection is back, and not inside a transaction: a
				// leaked one would block this query, a failed one refuse it.
				qctx, qcancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer qcancel()
				var inboxN, effectsN, idleInTx int
				require.NoError(t, pool.QueryRow(qctx, `SELECT (SELECT count(*) FROM inbox_messages), (SELECT count(*) FROM effects),
					(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%')`).
					Scan(&inboxN, &effectsN, &idleInTx))
				require.Zero(t, inboxN, "inbox rows committed")
				require.Zero(t, effectsN, "effects committed")
				require.Zero(t, idleInTx, "a transaction was left open")

				results, err = inbox.ProcessBatch(qctx, pool, "billing", msgs, nil)
				require.NoError(t, err)
				require.Equal(t, []inbox.Result{{}, {}, {}}, results)
			})
		}
	})

	t.Run("PackageFuncAndStoreUseTheirOwnTables", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		ledger := newStore(t, b.pool, inbox.Tables{Schema: "billing", Messages: "ledger_inbox"})
		msgs := messages("m-1", "m-2")

		results, err := inbox.ProcessBatch(ctx, b.pool, "payments", msgs, nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}}, results)
		results, err = ledger.ProcessBatch(ctx, b.pool, "payments", messages("m-1", "m-3"), nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{}, {}}, results, "m-1 is new to the ledger's table")

		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages`))
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM inbox_messages WHERE message_id = 'm-3'`))
		require.Equal(t, 2, countRows(t, b.pool, `SELECT count(*) FROM billing.ledger_inbox`))
		require.Zero(t, countRows(t, b.pool, `SELECT count(*) FROM billing.ledger_inbox WHERE message_id = 'm-2'`))

		results, err = ledger.ProcessBatch(ctx, b.pool, "payments", messages("m-3", "m-2"), nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{Duplicate: true}, {}}, results)
		results, err = inbox.ProcessBatch(ctx, b.pool, "payments", messages("m-2", "m-3"), nil)
		require.NoError(t, err)
		require.Equal(t, []inbox.Result{{Duplicate: true}, {}}, results)
	})

	t.Run("WaitsForAConcurrentDeliveryOfTheSameMessage", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		// Two deliveries held open by Process: m-2's commits, m-3's fails. The batch waits
		// for each on its inbox row; m-2 is then a duplicate, and m-3 runs in the batch.
		type held struct {
			pid     chan uint32
			release chan struct{}
			unblock func()
			done    chan error
		}
		hold := func(id string, fail bool) *held {
			h := &held{pid: make(chan uint32, 1), release: make(chan struct{}), done: make(chan error, 1)}
			h.unblock = sync.OnceFunc(func() { close(h.release) })
			t.Cleanup(h.unblock) // also when the test fails before releasing
			go func() {
				_, err := inbox.Process(ctx, b.pool, "billing", inbox.Message{ID: id}, func(ctx context.Context, tx pgx.Tx) error {
					var pid uint32
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					h.pid <- pid
					<-h.release
					if fail {
						return errors.New("the other delivery failed")
					}
					return recordEffect("billing", id)(ctx, tx)
				})
				h.done <- err
			}()
			return h
		}
		waitBlockedBy := func(pid uint32) {
			testinfra.Eventually(t, 30*time.Second, func() bool {
				return countRows(t, b.pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pid) == 1
			}, "the batch never waited for backend %d", pid)
		}
		m2, m3 := hold("m-2", false), hold("m-3", true)
		m2pid, m3pid := <-m2.pid, <-m3.pid

		msgs := messages("m-1", "m-2", "m-3")
		h := &batchHandler{consumer: "billing", msgs: msgs}
		type outcome struct {
			results []inbox.Result
			err     error
		}
		batch := make(chan outcome, 1)
		go func() {
			results, err := inbox.ProcessBatch(ctx, b.pool, "billing", msgs, h.fn)
			batch <- outcome{results, err}
		}()

		waitBlockedBy(m2pid)
		m2.unblock()
		require.NoError(t, <-m2.done)
		waitBlockedBy(m3pid)
		m3.unblock()
		require.Error(t, <-m3.done)

		got := <-batch
		require.NoError(t, got.err)
		require.Equal(t, []inbox.Result{{}, {Duplicate: true}, {}}, got.results)
		require.Equal(t, []int{0, 2}, h.called)
		for _, id := range []string{"m-1", "m-2", "m-3"} {
			require.Equal(t, 1, effects(t, b.pool, id), id)
			require.Equal(t, 1, inboxRows(t, b.pool, id), id)
		}
	})

	t.Run("QueryExecModes", func(t *testing.T) {
		t.Parallel()
		for mode := range testinfra.QueryExecModes {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				pool := testinfra.NewPoolInMode(t, mode)
				require.NoError(t, inbox.Migrate(ctx, pool))
				_, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL)`)
				require.NoError(t, err)
				msgs := []inbox.Message{
					{ID: "m-1", Type: "order.placed", ReceivedAt: time.Now()},
					{ID: "m-2"},
					{ID: "m-1", Type: "order.placed"},
					{ID: "m-4"},
				}
				failM2 := true
				h := &batchHandler{consumer: "c", msgs: msgs}
				h.handle = func(ctx context.Context, tx pgx.Tx, i int) error {
					if i == 1 && failM2 {
						_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
						return err
					}
					return nil
				}

				results, err := inbox.ProcessBatch(ctx, pool, "c", msgs, h.fn)
				require.NoError(t, err)
				require.Len(t, results, 4)
				require.Error(t, results[1].Err)
				results[1].Err = nil
				require.Equal(t, []inbox.Result{{}, {}, {Duplicate: true}, {}}, results)

				failM2 = false
				results, err = inbox.ProcessBatch(ctx, pool, "c", msgs, h.fn)
				require.NoError(t, err)
				require.Equal(t, []inbox.Result{{Duplicate: true}, {}, {Duplicate: true}, {Duplicate: true}}, results)
				require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM inbox_messages`))
				require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM effects`))
			})
		}
	})

	// ProcessBatch promises that a message whose inbox row PostgreSQL refused fails alone,
	// as its Result, marked Permanent. On a pool in the simple protocol (PgBouncer in
	// transaction pooling), the savepoint and the insert travel as one query string, and
	// the server converts a query string into its encoding before it runs any of it: a
	// value it cannot store refuses the savepoint as well, and with it the whole batch.
	t.Run("RefusedInboxRowFailsItsMessageAloneInSimpleProtocol", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		latin1 := latin1Pool(t)
		require.NoError(t, inbox.Migrate(ctx, latin1))
		cfg, err := pgxpool.ParseConfig(latin1.Config().ConnString() + "&default_query_exec_mode=simple_protocol")
		require.NoError(t, err)
		simple, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(simple.Close)

		results, err := inbox.ProcessBatch(ctx, simple, "billing", messages("eur-1", "price-in-€", "eur-3"), nil)
		require.NoError(t, err, "one message's refused value failed the whole batch")
		require.Len(t, results, 3)
		require.Equal(t, inbox.Result{}, results[0])
		require.Equal(t, inbox.Result{}, results[2])
		require.True(t, inbox.IsPermanent(results[1].Err), "%v", results[1].Err)
		require.Equal(t, 2, countRows(t, latin1, `SELECT count(*) FROM inbox_messages`))
	})
}
