package outbox

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/retry"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/walstream"
)

// The WAL relay's statements (see [WALRelay] for the rules they keep).

// claimHanded is the retry lane's claim: claimBatch restricted to the rows the stream handed
// to the table (last_error set). The head rule still looks at every pending row, so a handed
// row never goes out before an older pending row of its aggregate. It ignores waiting, which
// only polling relays set and their maintenance clears: a row a polling relay left waiting
// before the WAL relay took over is claimed all the same once it is its aggregate's head.
var claimHanded = mustReplace(claimBatch,
	"AND NOT o.waiting AND",
	"AND o.last_error IS NOT NULL AND")

// mustReplace replaces old, which must be in s, once.
func mustReplace(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic("outbox: statement has no " + old)
	}
	return strings.Replace(s, old, new, 1)
}

// markHeld hands rows to the retry lane without publishing them: their aggregate has an
// older row there. A row that already has a last_error keeps it (it was handed before a
// restart streamed it again, say), and a row that is no longer pending stays as it is. It
// returns how many of the rows it sees, whatever their state (see dispatcher.mark).
const markHeld = `
WITH held AS (
    UPDATE {{.Messages}} SET last_error = $2
    WHERE id = ANY($1::uuid[]) AND published_at IS NULL AND dead_at IS NULL AND last_error IS NULL
    RETURNING 1)
SELECT count(*) FROM {{.Messages}} WHERE id = ANY($1::uuid[])`

// pendingBefore lists the pending rows not yet handed to the retry lane: read with the
// snapshot of a slot just created, the rows committed before the slot's first streamed
// commit, which the slot will never stream. handPending then hands those still pending.
// Two steps, because the snapshot's transaction is REPEATABLE READ: an UPDATE in it fails on
// every row a polling relay (switching over, or the lane) marked since the snapshot.
const (
	pendingBefore = `
SELECT id FROM {{.Messages}}
WHERE published_at IS NULL AND dead_at IS NULL AND last_error IS NULL`
	handPending = `
UPDATE {{.Messages}} SET last_error = $2
WHERE id = ANY($1::uuid[]) AND published_at IS NULL AND dead_at IS NULL AND last_error IS NULL`
)

// heldAggregates lists the aggregates that have rows in the retry lane.
const heldAggregates = `
SELECT DISTINCT aggregate_type, aggregate_id FROM {{.Messages}}
WHERE published_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL`

// stillHeld returns those of the given aggregates that still have rows in the retry lane.
const stillHeld = `
SELECT a.aggregate_type, a.aggregate_id
FROM unnest($1::text[], $2::text[]) AS a(aggregate_type, aggregate_id)
WHERE EXISTS (
    SELECT 1 FROM {{.Messages}} o
    WHERE o.aggregate_type = a.aggregate_type AND o.aggregate_id = a.aggregate_id
      AND o.published_at IS NULL AND o.dead_at IS NULL AND o.last_error IS NOT NULL)`

// publicationHas tells whether publication $1 exists, publishes inserts, holds the outbox
// table ($2, its quoted name) however (FOR TABLE, FOR TABLES IN SCHEMA, FOR ALL TABLES),
// and with a row filter or a column list (PostgreSQL 15), either of which would keep rows,
// or columns, from the stream; and whether it publishes a partitioned table's rows as the
// table's rather than their partition's (publish_via_partition_root), which a partitioned
// outbox needs: pg_publication_tables lists its partitions otherwise, not the table.
const publicationHas = `
WITH tbl AS (
    SELECT n.nspname, c.relname, c.relkind = 'p' AS partitioned,
           (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) AS columns
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass($2))
SELECT p.pubinsert, p.pubviaroot, coalesce((SELECT partitioned FROM tbl), false), t.pubname IS NOT NULL,
       coalesce(t.rowfilter IS NOT NULL, false),
       coalesce(cardinality(t.attnames) < (SELECT columns FROM tbl), false)
FROM pg_publication p
LEFT JOIN pg_publication_tables t
       ON t.pubname = p.pubname AND (t.schemaname, t.tablename) = (SELECT nspname, relname FROM tbl)
WHERE p.pubname = $1`

// tableSchema is the schema of the outbox table ($1, its quoted name), for the stream to
// match the table's inserts exactly; and whether the relay's role may delete from it
// ([Config].DeletePublished).
const tableSchema = `
SELECT n.nspname, has_table_privilege(c.oid, 'DELETE') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

// The slot's hand-over record: <table>_wal_slots, made by Store.CreatePublication, holds a
// row per slot whose creation handed the rows pending then to the retry lane (handPending,
// in the same transaction). A slot without its row was created by a relay that died, or was
// cancelled, before the hand-over committed: it is dropped and created again. The statements
// are formats of the record's quoted name (%[1]s).
const (
	walSlotsCreate = `CREATE TABLE IF NOT EXISTS %[1]s (slot text PRIMARY KEY, handed_at timestamptz NOT NULL)`
	walSlotsMark   = `INSERT INTO %[1]s (slot, handed_at) VALUES ($1, now())
ON CONFLICT (slot) DO UPDATE SET handed_at = excluded.handed_at`
	// walSlotsState: whether the slot exists, whether it was invalidated (it kept more WAL
	// than max_slot_wal_keep_size: the server removed WAL it still needed, so it can never
	// stream again), the hand-over record's time (NULL: none), which tells one creation
	// of the slot from the next, and the database of a slot of that name that is not this
	// database's (a slot's name is the server's: another outbox on the same server may
	// have taken it; a physical slot has no database).
	walSlotsState = `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database() AND wal_status = 'lost'),
       (SELECT handed_at FROM %[1]s WHERE slot = $1),
       (SELECT coalesce('database ' || database, 'a physical slot') FROM pg_replication_slots
        WHERE slot_name = $1 AND database IS DISTINCT FROM current_database())`
	walSlotsForget   = `DELETE FROM %[1]s WHERE slot = $1`
	walSlotsHandedAt = `SELECT handed_at FROM %[1]s WHERE slot = $1`
	// walSlotsLock: one relay at a time checks, drops or creates a slot. A transaction's
	// advisory lock, which assigns no transaction id, so that it does not hold back the
	// slot's creation (which waits for the transactions that have one).
	walSlotsLock = `SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.wal.' || $1, 0))`
)

// walSlots is the quoted, schema-qualified name of t's hand-over record.
func (t Tables) walSlots() string { return t.qualified(t.WithDefaults().Messages + "_wal_slots") }

// Reasons the WAL relay writes in last_error when it hands a row to its retry lane.
const (
	reasonHeld    = "held: an older message of its aggregate is being retried"
	reasonBefore  = "pending when the WAL relay's slot was created"
	walSlotMaxLen = 63 // PostgreSQL's NAMEDATALEN - 1
)

// WALConfig says where a [WALRelay] reads its table's inserts.
type WALConfig struct {
	// URL connects to the outbox's database as a role with the REPLICATION attribute (or a
	// superuser), in replication mode; the relay adds replication=database itself. Required.
	// A URL says TLS as libpq's do (sslmode=verify-full&sslrootcert=/path/ca.crt, with
	// sslcert and sslkey for a client certificate).
	URL string
	// TLSConfig, when set, is the replication connection's TLS configuration, for what a URL
	// cannot say (a certificate held in memory, a custom verification): it replaces the one
	// the URL's sslmode and ssl* parameters give, for every host of the URL, each with the
	// host as its ServerName unless one is set, and the connection never goes without TLS.
	// The pool's connections take theirs from the pool's own configuration
	// (pgxpool.Config.ConnConfig.TLSConfig).
	TLSConfig *tls.Config
	// Slot is the logical replication slot the relay reads, created at its first start:
	// lower-case letters, digits and underscores, at most 63. Default: [Tables.WALName].
	Slot string
	// Publication is the publication of the outbox table for INSERTs
	// ([Store.CreatePublication]). Default: [Tables.WALName].
	Publication string
	// StatusInterval is how often the relay tells the server its position while no
	// confirmation moves it, well inside the server's wal_sender_timeout. Default 1s. Each
	// status asks the server for a reply: a stream that hears nothing for 10s (or three
	// intervals, if longer) takes its server for gone, or cut off by the network, and is
	// opened again, as after any outage.
	StatusInterval time.Duration
}

var walSlotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// WALName is the default name of the publication and the replication slot of a WAL relay
// of t's table ([WALConfig]): the table's name, after its schema's when Schema is set, in
// lower case with every character a slot name cannot hold turned into "_", shortened with a
// hash past 63 bytes.
func (t Tables) WALName() string {
	t = t.WithDefaults()
	name := t.Messages
	if t.Schema != "" {
		name = t.Schema + "_" + name
	}
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '_'
	}, name)
	if len(name) > walSlotMaxLen {
		h := fnv.New32a()
		h.Write([]byte(t.Schema + "." + t.Messages))
		name = fmt.Sprintf("%s_%08x", name[:walSlotMaxLen-9], h.Sum32())
	}
	return name
}

// CreatePublication sets the database up for a [WALRelay] of the store's table: the
// publication it reads, name (empty: [Tables.WALName]), for INSERTs into the table and
// nothing else, and the table <table>_wal_slots in which the relay records the creation of
// its slots. It does nothing that is done, and fails when a publication of that name exists
// but does not publish the table's INSERTs whole. It needs to own the table (a migration's
// role, typically); the relay's role needs SELECT, INSERT, DELETE on <table>_wal_slots.
//
// Processes may call it at once (each at its start, say): the one that finds done what
// another made a moment before tries once more and finds it done. On a pool, that is; in a
// transaction the first error ends the transaction.
func (s *Store) CreatePublication(ctx context.Context, db DBTX, name string) error {
	name = cmp.Or(name, s.tables.WALName())
	// CREATE TABLE IF NOT EXISTS and CREATE PUBLICATION of two sessions at once: the one
	// that commits last fails on what the other made (a catalog's unique index, or the
	// object itself), and tries again. Each failure is a race lost to a commit, at one of
	// the two statements: a few tries always find both done.
	var err error
	for range 5 {
		err = s.createPublication(ctx, db, name)
		if !isCode(err, "23505") && !isCode(err, "42P07") && !isCode(err, "42710") {
			return err
		}
	}
	return err
}

func (s *Store) createPublication(ctx context.Context, db DBTX, name string) error {
	if _, err := db.Exec(ctx, fmt.Sprintf(walSlotsCreate, s.tables.walSlots())); err != nil {
		return fmt.Errorf("outbox: create %s: %w", s.tables.walSlots(), err)
	}
	ok, err := s.checkPublication(ctx, db, name)
	if ok || !errors.Is(err, errNoPublication) {
		return err
	}
	// A utility statement: no parameters, so the names are quoted into it.
	create := "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() + " FOR TABLE " +
		s.tables.sqlNames().Messages + " WITH (publish = 'insert')"
	if s.tables.Partition != 0 {
		create = strings.TrimSuffix(create, ")") + ", publish_via_partition_root = true)"
	}
	if _, err := db.Exec(ctx, create); err != nil {
		return fmt.Errorf("outbox: create publication %s: %w", name, err)
	}
	return nil
}

// The ways a publication is not what the WAL relay reads: errNoPublication, and
// errPublicationShape (it exists, but the table's INSERTs are not in it, or not whole).
var (
	errNoPublication    = errors.New("no such publication")
	errPublicationShape = errors.New("the publication does not stream the table's inserts whole")
)

// checkPublication reports whether publication name holds the table for INSERTs, whole; the
// error says why not, wrapping errNoPublication or errPublicationShape.
func (s *Store) checkPublication(ctx context.Context, db DBTX, name string) (bool, error) {
	var inserts, viaRoot, partitioned, holds, filtered, columns bool
	table := s.tables.qualified(s.tables.Messages)
	err := db.QueryRow(ctx, s.sql.publicationHas, name, s.tables.sqlNames().MessagesText).Scan(&inserts, &viaRoot, &partitioned, &holds, &filtered, &columns)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("outbox: publication %s: %w", name, errNoPublication)
	case err != nil:
		return false, fmt.Errorf("outbox: read publication %s: %w", name, err)
	case !holds && partitioned && !viaRoot:
		// pg_publication_tables lists the partitions then, not the table: it may hold it.
		return false, fmt.Errorf("outbox: publication %s does not stream the rows of the partitioned table %s as the table's (ALTER PUBLICATION %s SET (publish_via_partition_root = true), and ADD TABLE %s if it lacks it): %w",
			name, table, name, table, errPublicationShape)
	case !holds:
		return false, fmt.Errorf("outbox: publication %s does not hold the table %s (ALTER PUBLICATION %s ADD TABLE %s): %w",
			name, table, name, table, errPublicationShape)
	case !inserts:
		return false, fmt.Errorf("outbox: publication %s does not publish INSERTs (ALTER PUBLICATION %s SET (publish = 'insert')): %w", name, name, errPublicationShape)
	case filtered:
		return false, fmt.Errorf("outbox: publication %s has a row filter on %s: the rows it keeps out would never be published: %w", name, table, errPublicationShape)
	case columns:
		return false, fmt.Errorf("outbox: publication %s has a column list on %s: messages would go out without the columns it leaves out: %w", name, table, errPublicationShape)
	}
	return true, nil
}

// ErrWALSetup is wrapped by the errors with which [WALRelay.Run] returns because the
// database is not set up for it: each says what to change.
var ErrWALSetup = errors.New("outbox: the database is not set up for the WAL relay")

// WALRelay publishes the outbox by tailing the transaction log: it reads the table's
// committed INSERTs from a logical replication slot (PostgreSQL's pgoutput), in commit
// order, and publishes them through the [Publisher] with confirms, as the polling [Relay]
// does, with the same [Config], the same table, the same [Add], and the same guarantees
// but where this comment says otherwise (README.md#polling-or-the-wal).
//
// How a row goes out: the stream's rows are sent in batches of up to [Config].BatchSize,
// [Config].InFlightBatches of them in flight at once. A batch that holds rows of an
// aggregate an earlier batch in flight holds publishes only once the broker confirmed every
// row of that earlier batch (its marks may still run): so an aggregate's rows reach the
// broker in commit order, and one aggregate's backlog flows a batch per confirm, not a row
// per relay cycle. The outcome of a batch is marked in the table as the polling relay marks
// it (published_at, or a DELETE with [Config].DeletePublished; or attempts, last_error and
// dead_at), in a short transaction; and the slot's position is confirmed only past commits
// whose every row is marked. A restart,
// after a crash at any point, streams again from that position: nothing is lost, and what
// is published again is at most the rows of the batches in flight, of the transactions
// not yet wholly marked (a position is the end of a commit), and of those marked since the
// server last heard the position (it is told as soon as the relay reads the stream again,
// and at least every StatusInterval).
//
// What the stream does not publish, it hands to the table, to the relay's retry lane (a
// polling relay that claims only such rows, with the polling relay's rules): a row whose
// publish failed for its own reason or was refused by the broker, with its attempt counted
// as the polling relay counts it; and every later row of an aggregate that has a row
// there, so that order holds (a row of the stream's batch after the failed one, sent with
// it, goes out before its retry: at most a batch). Such rows carry a last_error. A broker
// outage hands nothing: the stream pauses, with the outage backoff, and publishes the same
// rows again. A permanent failure (poison) marks the row dead at once, and the stream goes
// on.
//
// Its pool needs 2·InFlightBatches + 2 connections: one per batch in flight (its barrier,
// then its marks), the lane's (a polling relay's [Relay.PoolSize]), and one for the
// stream's own reads; the stream's replication connection is its own, outside the pool.
//
// The slot is created at the first start, and the rows pending then, which it will never
// stream, are handed to the retry lane in the same snapshot; <table>_wal_slots records the
// hand-over in the same transaction, and a slot found without its record is dropped and
// created again. A slot lost (dropped by an operator, left behind by a failover) or
// invalidated (max_slot_wal_keep_size; the relay drops it) is created again the same way:
// the rows pending then go out through the retry lane, and the position kept from the old
// slot is forgotten. Only one WALRelay can stream a
// slot: the others stand by ([StateStandby], ready) and try to take it every
// [Config].PollInterval, so that one takes over within about that once the server has
// released it: at once when the streaming process died or closed its connection, after
// wal_sender_timeout when it stopped answering (paused, or cut off).
type WALRelay struct {
	lane *Relay // the retry lane; its machinery also publishes and marks the stream's batches
	db   WALRelayDB
	cfg  Config
	wal  WALConfig
	sql  statements
	// failures spaces the stream's restarts with the outage backoff and logs each streak.
	failures *retry.Streak

	running atomic.Bool
	mu      sync.Mutex
	state   State
	// downSince is when the stream last became unable to do its job, lastErr the last
	// error since; for Ready.
	downSince time.Time
	lastErr   error
	// recreating is why the slot was dropped or found gone, until a new one is created:
	// a session that failed in between finds neither slot nor record (Run's goroutine only).
	recreating SlotReason
}

// WALRelayDB is what a WAL relay needs of the database, besides its replication connection:
// a [RelayDB] that also runs queries. A *pgxpool.Pool satisfies it.
type WALRelayDB interface {
	RelayDB
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// NewWALRelay returns a relay that publishes the rows of cfg.Tables' outbox table in
// pool's database through pub, reading them from wal's slot. It fills in and checks cfg and
// wal; it does not touch the database before Run.
func NewWALRelay(pool WALRelayDB, pub Publisher, cfg Config, wal WALConfig) (*WALRelay, error) {
	if wal.URL == "" {
		return nil, errors.New("outbox: NewWALRelay needs WALConfig.URL, the database URL for a replication connection")
	}
	cfg.DisableNotify = true // the lane polls: its rows come from UPDATEs, which do not notify
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	// The lane logs as part of the relay, and its state is not the relay's.
	laneCfg := cfg
	laneCfg.Logger = cfg.Logger.With("lane", "retry")
	laneCfg.Hooks.StateChanged = nil
	lane, err := NewRelay(pool, pub, laneCfg)
	if err != nil {
		return nil, err
	}
	wal.Slot = cmp.Or(wal.Slot, cfg.Tables.WALName())
	wal.Publication = cmp.Or(wal.Publication, cfg.Tables.WALName())
	wal.StatusInterval = cmp.Or(wal.StatusInterval, time.Second)
	if !walSlotName.MatchString(wal.Slot) {
		return nil, fmt.Errorf("outbox: WAL relay: slot name %q: lower-case letters, digits and underscores, at most 63", wal.Slot)
	}
	if wal.StatusInterval < 0 {
		return nil, fmt.Errorf("outbox: WAL relay: status interval must be >= 0 (0 means 1s), got %s", wal.StatusInterval)
	}
	lane.lane = true
	lane.claimSQL = lane.sql.claimHanded
	w := &WALRelay{lane: lane, db: pool, cfg: cfg, wal: wal, sql: lane.sql, state: StateStarting}
	w.failures = &retry.Streak{What: "outbox WAL relay", Logger: cfg.Logger,
		Backoff: retry.Backoff{Base: cfg.OutageBaseDelay, Max: cfg.OutageMaxDelay}}
	return w, nil
}

// State reports what the relay's stream is doing now.
func (w *WALRelay) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// Ready returns nil while Run runs and the stream can do its job, or has been unable to for
// at most maxUnavailable, as [Relay.Ready] does: otherwise an error that says what is down,
// since when, and the last error; or that Run is not running. It speaks for the stream: the
// retry lane's outages are the same broker's and database's, and its rows wait meanwhile.
// A stream stopped for its set-up ([ErrWALSetup]) is not running.
func (w *WALRelay) Ready(maxUnavailable time.Duration) error {
	w.mu.Lock()
	state, since, lastErr := w.state, w.downSince, w.lastErr
	w.mu.Unlock()
	return readiness("WAL relay", w.running.Load(), state, since, lastErr, maxUnavailable)
}

// PoolSize reports the connections the relay may hold at once against its pool's size:
// 2·[Config].InFlightBatches + 2 (a barrier and the marks of each batch in flight, the
// stream's own reads, and the retry lane's [Relay.PoolSize]), not counting the replication
// connection, which is its own.
func (w *WALRelay) PoolSize() PoolSize {
	return PoolSize{Needed: 2*w.cfg.InFlightBatches + 2, Max: poolMax(w.db)}
}

func (w *WALRelay) setState(to State, cause error) {
	w.mu.Lock()
	from := w.state
	w.state = to
	if unavailable(to) {
		if !unavailable(from) {
			w.downSince = time.Now()
		}
		w.lastErr = cause
	}
	w.mu.Unlock()
	if from == to {
		return
	}
	w.cfg.Logger.Info("outbox WAL relay state", "state", to, "previous", from)
	if h := w.cfg.Hooks.StateChanged; h != nil {
		w.lane.hook(func() { h(StateChange{From: from, To: to, Err: cause}) })
	}
}

// Run streams and publishes until ctx is cancelled, then finishes the batches in flight,
// tells the server how far it got and ends its replication, so that the slot is free for
// the next relay at once (unless the server does not answer within 5 s: it first sends the
// rest of a transaction of the publication it is sending, which for hundreds of thousands
// of rows can take longer), and returns nil;
// or returns an error wrapping [ErrWALSetup] when the database is not set up
// for it (wal_level, the role, the publication, the server's limits), at once rather than
// retry what only an operator can change. It rides out the broker and the database going
// away as [Relay.Run] does. Run may be called again after it returned, but not twice at once.
func (w *WALRelay) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("outbox: WAL relay is already running")
	}
	defer w.running.Store(false)
	lctx, stopLane := context.WithCancel(ctx)
	var lane sync.WaitGroup
	defer lane.Wait()
	defer stopLane()
	lane.Go(func() { _ = w.lane.Run(lctx) }) // returns nil once lctx ends, or "already running"

	var confirmed slotPosition
	for {
		err := w.session(ctx, &confirmed)
		if ctx.Err() != nil {
			w.setState(StateStopped, nil)
			return nil
		}
		if errors.Is(err, ErrWALSetup) {
			w.setState(StateStopped, err)
			return err
		}
		if errors.Is(err, errSlotInUse) {
			// Not an outage: a standby, which takes over once the slot is free.
			if w.State() != StateStandby {
				w.cfg.Logger.Info("outbox WAL relay: another process streams the slot; standing by", "slot", w.wal.Slot)
			}
			w.failures.Succeed(ctx)
			w.setState(StateStandby, nil)
			if !retry.Sleep(ctx, w.cfg.PollInterval) {
				w.setState(StateStopped, nil)
				return nil
			}
			continue
		}
		w.setState(stateFor(err), err)
		if !retry.Sleep(ctx, w.failures.Fail(ctx, err)) {
			w.setState(StateStopped, nil)
			return nil
		}
	}
}

// walRow is a row of the stream on its way out.
type walRow struct {
	msg        Message
	unreadable error
	commit     *walCommit
	ord        int64 // its place in the stream, to put rows back in order
}

// walCommit is a streamed transaction: its end, and how many of its rows are not settled.
type walCommit struct {
	end       pglogrepl.LSN
	xid       uint32
	at        time.Time // its commit time
	unsettled int
}

// walBatch is a batch of the stream in flight.
type walBatch struct {
	rows []walRow
	aggs map[aggregateKey]bool
	done chan struct{}
	// preds are the batches in flight, when it was sent, that hold rows of its aggregates:
	// it publishes once each has released it. released is closed once the batch's outcome
	// no longer holds back the rows after it: as soon as the broker confirmed every row it
	// published (before its marks), or else when it ends; stops, set before, says the rows
	// after it must not go out now (some of its own were left unsent, or it failed).
	preds    []*walBatch
	released chan struct{}
	stops    bool
	// After done: the rows left as they were (the broker was unavailable, or did not take
	// them), the outage that ended the batch, and the aggregates it handed to the lane.
	untouched []walRow
	err       error
	handed    []aggregateKey
}

type aggregateKey struct{ typ, id string }

func keyOf(m Message) aggregateKey { return aggregateKey{m.AggregateType, m.AggregateID} }

// slotPosition is the position this process confirmed, kept across sessions, and the
// creation of the slot it belongs to (its hand-over record's time): a position of another
// creation means nothing to this one.
type slotPosition struct {
	lsn     pglogrepl.LSN
	created time.Time
}

// session streams from the slot until an error, or ctx ends. confirmed is the position
// this process confirmed, kept across sessions.
func (w *WALRelay) session(ctx context.Context, confirmed *slotPosition) error {
	switch ok, err := w.lane.storeOf().checkPublication(ctx, w.db, w.wal.Publication); {
	case errors.Is(err, errNoPublication):
		with := "publish = 'insert'"
		if w.cfg.Tables.Partition != 0 {
			with += ", publish_via_partition_root = true"
		}
		return fmt.Errorf("%w: %w (create it with Store.CreatePublication, or CREATE PUBLICATION %s FOR TABLE %s WITH (%s))",
			ErrWALSetup, err, w.wal.Publication, w.cfg.Tables.qualified(w.cfg.Tables.Messages), with)
	case errors.Is(err, errPublicationShape):
		return fmt.Errorf("%w: %w", ErrWALSetup, err)
	case !ok:
		return databaseError{err}
	}
	var (
		schema    string
		mayDelete bool
	)
	if err := w.db.QueryRow(ctx, tableSchema, w.cfg.Tables.sqlNames().MessagesText).Scan(&schema, &mayDelete); err != nil {
		return databaseError{fmt.Errorf("read the outbox table's schema: %w", err)}
	}
	if w.cfg.DeletePublished && !mayDelete {
		return fmt.Errorf("%w: %w (GRANT DELETE ON %s TO the relay's role)", ErrWALSetup, errNoDelete, w.cfg.Tables.sqlNames().MessagesText)
	}
	cfg := walstream.Config{
		URL: w.wal.URL, TLSConfig: w.wal.TLSConfig, Slot: w.wal.Slot, Publication: w.wal.Publication,
		Schema: schema, Table: w.cfg.Tables.Messages,
		StatusInterval: w.wal.StatusInterval,
	}
	st, err := w.open(ctx, cfg, confirmed)
	if err != nil {
		return err
	}
	defer func() {
		// A last status, and the replication ended, bounded: the server may be gone. A
		// session that ended for any reason but a stop waits less for its answer: the next
		// session is what matters then.
		bound := 5 * time.Second
		if ctx.Err() == nil {
			bound = time.Second
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
		defer cancel()
		_ = st.Close(cctx)
	}()
	// After Open: a slot it created has handed the rows pending before it to the lane.
	held, err := w.loadHeld(ctx)
	if err != nil {
		return databaseError{err}
	}
	w.cfg.Logger.Info("outbox WAL relay streaming", "slot", w.wal.Slot, "publication", w.wal.Publication, "from", st.Confirmed().String())
	w.setState(StateRunning, nil)
	w.failures.Succeed(ctx)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	commits := make(chan walstream.Commit, 16)
	readErr := make(chan error, 1)
	var reader sync.WaitGroup
	defer reader.Wait()
	defer cancel()
	reader.Go(func() { readErr <- w.read(sctx, st, commits) })

	d := &dispatcher{w: w, st: st, held: held, confirmed: &confirmed.lsn, streamServer: st.ServerStarted(), streamPID: st.PID()}
	// What an earlier session left unsettled is streamed again (and reported again) from
	// the slot's position, or was handed to the retry lane with a new slot.
	d.progress(time.Time{})
	err = d.run(sctx, commits, readErr)
	// Nothing in flight now. A relay that stops, or stands by while another streams the
	// slot, is not behind; one that fails stays as far behind as it was, and more, until a
	// session of its own streams again.
	if ctx.Err() != nil || errors.Is(err, errSlotInUse) {
		d.mu.Lock()
		d.progress(time.Time{})
		d.mu.Unlock()
	}
	return err
}

// open opens the stream, creating the slot if it is missing, under the slot's lock: a slot
// that exists without its hand-over record (its creator died, or was cancelled, before the
// rows pending then were handed to the lane) is dropped and created again, so that no row
// pending at a slot's creation is left to nobody.
//
// This is also the catch-up after a slot was lost: dropped by an operator, gone with a
// failover (a slot lives on its primary only, before PostgreSQL 17's failover slots), or
// invalidated for keeping more WAL than max_slot_wal_keep_size (dropped here). Every row
// still pending when the new slot is created is handed to the retry lane, which publishes
// it in its aggregate's order: nothing is lost, and what goes out again is the rows of
// the old slot that were published but not yet marked.
//
// The stream starts from confirmed's position only when the slot is the creation that
// position belongs to: a new slot's stream starts where the slot was created, which can be
// before a position of the old one (a standby promoted before it received the last WAL the
// old primary streamed), and starting later would skip commits.
func (w *WALRelay) open(ctx context.Context, cfg walstream.Config, confirmed *slotPosition) (*walstream.Stream, error) {
	record := w.cfg.Tables.walSlots()
	lock, err := w.db.Begin(ctx)
	if err != nil {
		return nil, databaseError{fmt.Errorf("lock slot %s: %w", cfg.Slot, err)}
	}
	defer rollback(ctx, lock)
	var locked bool
	if err := lock.QueryRow(ctx, walSlotsLock, cfg.Slot).Scan(&locked); err != nil {
		return nil, databaseError{fmt.Errorf("lock slot %s: %w", cfg.Slot, err)}
	}
	if !locked {
		return nil, databaseError{fmt.Errorf("slot %s: another WAL relay is setting it up; waiting", cfg.Slot)}
	}
	var exists, lost bool
	var handedAt *time.Time
	var elsewhere *string
	if err := w.db.QueryRow(ctx, fmt.Sprintf(walSlotsState, record), cfg.Slot).Scan(&exists, &lost, &handedAt, &elsewhere); err != nil {
		if isCode(err, "42P01") { // undefined_table
			return nil, fmt.Errorf("%w: %w (create it with Store.CreatePublication)", ErrWALSetup, err)
		}
		return nil, databaseError{fmt.Errorf("read slot %s: %w", cfg.Slot, err)}
	}
	if elsewhere != nil {
		// Never dropped: it is another outbox's, or someone else's.
		return nil, fmt.Errorf("%w: the replication slot %s is %s's: slot names are the server's, not a database's; give this relay a slot of its own (WALConfig.Slot)",
			ErrWALSetup, cfg.Slot, *elsewhere)
	}
	drop, reason := "", SlotNew
	switch {
	case exists && lost:
		reason = SlotInvalidated
		drop = "the slot was invalidated: it kept more WAL than max_slot_wal_keep_size, and the server removed WAL it needed; dropping it to create it again, the rows still pending go out through the retry lane"
	case exists && handedAt == nil:
		reason = SlotUnfinished
		drop = "the slot's creator stopped before handing the rows pending then to the retry lane; dropping the slot to create it again"
	}
	if drop != "" {
		w.cfg.Logger.Warn("outbox WAL relay: "+drop, "slot", cfg.Slot)
		if err := walstream.Drop(ctx, cfg); err != nil {
			return nil, w.classify(err)
		}
		exists = false
	}
	if !exists {
		if handedAt != nil && drop == "" {
			reason = SlotGone
			w.cfg.Logger.Warn("outbox WAL relay: the slot is gone (dropped, or left behind on the old primary by a failover); creating it again, the rows still pending go out through the retry lane",
				"slot", cfg.Slot)
		}
		if _, err := w.db.Exec(ctx, fmt.Sprintf(walSlotsForget, record), cfg.Slot); err != nil {
			return nil, databaseError{fmt.Errorf("slot %s: %w", cfg.Slot, err)}
		}
		handedAt = nil
		if reason != SlotNew {
			w.recreating = reason
		}
		reason = cmp.Or(w.recreating, reason)
	}
	if handedAt == nil || !handedAt.Equal(confirmed.created) {
		*confirmed = slotPosition{} // another creation's position, or none
	}
	cfg.Created = func(ctx context.Context, snapshot string) error { return w.handPending(ctx, snapshot, reason) }
	cfg.Start = confirmed.lsn
	st, err := walstream.Open(ctx, cfg)
	if err != nil {
		return nil, w.classify(err)
	}
	if handedAt == nil { // created now: read its hand-over's time
		if err := w.db.QueryRow(ctx, fmt.Sprintf(walSlotsHandedAt, record), cfg.Slot).Scan(&handedAt); err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second) // a failure: see session
			defer cancel()
			_ = st.Close(cctx)
			return nil, databaseError{fmt.Errorf("read slot %s: %w", cfg.Slot, err)}
		}
	}
	confirmed.created = *handedAt
	return st, nil
}

// isCode reports whether err is a PostgreSQL error of the given SQLSTATE.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// read receives the stream's commits into commits until an error or ctx ends. While the
// dispatcher is busy it keeps telling the server its position, so that the walsender does
// not time out a relay that waits for the broker.
func (w *WALRelay) read(ctx context.Context, st *walstream.Stream, commits chan<- walstream.Commit) error {
	tick := time.NewTicker(w.wal.StatusInterval)
	defer tick.Stop()
	for {
		c, err := st.Next(ctx)
		if err != nil {
			return w.classify(err)
		}
		for sent := false; !sent; {
			select {
			case commits <- c:
				sent = true
			case <-tick.C:
				if err := st.Status(ctx); err != nil {
					return databaseError{fmt.Errorf("replication status: %w", err)}
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// errSlotInUse: another process streams the slot.
var errSlotInUse = errors.New("the slot is streamed by another process")

// classify blames a stream's error: the database's set-up ([ErrWALSetup]), or the database.
func (w *WALRelay) classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return databaseError{err}
	}
	switch pgErr.Code {
	case "55000": // object_not_in_prerequisite_state: wal_level
		if strings.Contains(pgErr.Message, "wal_level") {
			return fmt.Errorf("%w: %w (set wal_level = logical in postgresql.conf and restart the server)", ErrWALSetup, err)
		}
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w: %w (the role of WALConfig.URL needs REPLICATION: ALTER ROLE … REPLICATION)", ErrWALSetup, err)
	case "53400": // configuration_limit_exceeded: all replication slots are in use
		return fmt.Errorf("%w: %w (raise max_replication_slots and restart the server, or drop an unused slot)", ErrWALSetup, err)
	case "53300": // too_many_connections: max_wal_senders
		if strings.Contains(pgErr.Message, "wal_senders") {
			return fmt.Errorf("%w: %w (raise max_wal_senders and restart the server)", ErrWALSetup, err)
		}
	case "42704": // undefined_object: the publication, from pgoutput; or the slot
		// A slot dropped after the session found it, before it streamed (an operator, a
		// failover's clean-up): the next session finds it gone and creates it again.
		if strings.Contains(pgErr.Message, "replication slot") {
			return databaseError{err}
		}
		return fmt.Errorf("%w: %w (create it with Store.CreatePublication)", ErrWALSetup, err)
	case "55006": // object_in_use: another relay streams the slot; stand by
		return fmt.Errorf("%w: %s: %w", errSlotInUse, w.wal.Slot, err)
	}
	return databaseError{err}
}

// handPending hands the rows pending at the slot's creation to the retry lane: exactly the
// rows the slot will never stream, read in the slot's snapshot, less those published or
// dead since (by a polling relay still running beside it). A relay that dies in between
// leaves a slot without its record: the next session drops it and starts again.
func (w *WALRelay) handPending(ctx context.Context, snapshot string, reason SlotReason) error {
	ids, err := w.pendingAt(ctx, snapshot)
	if err != nil {
		return fmt.Errorf("hand the pending rows to the retry lane: %w", err)
	}
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("hand the pending rows to the retry lane: %w", err)
	}
	defer rollback(ctx, tx)
	tag, err := tx.Exec(ctx, w.sql.handPending, ids, reasonBefore)
	if err != nil {
		return fmt.Errorf("hand the pending rows to the retry lane: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(walSlotsMark, w.cfg.Tables.walSlots()), w.wal.Slot); err != nil {
		return fmt.Errorf("record the hand-over: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("hand the pending rows to the retry lane: commit: %w", err)
	}
	n := tag.RowsAffected()
	if n > 0 {
		w.cfg.Logger.Info("outbox WAL relay: slot created; the rows pending before it go out through the retry lane",
			"slot", w.wal.Slot, "rows", n, "reason", string(reason))
	}
	w.recreating = ""
	if h := w.cfg.Hooks.SlotCreated; h != nil {
		w.lane.hook(func() { h(SlotCreated{Reason: reason, Handed: n}) })
	}
	return nil
}

// pendingAt lists the ids of pendingBefore in the snapshot.
func (w *WALRelay) pendingAt(ctx context.Context, snapshot string) ([]uuid.UUID, error) {
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer rollback(ctx, tx)
	// The snapshot must be imported first, at REPEATABLE READ; its name is the server's.
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return nil, fmt.Errorf("import snapshot: %w", err)
	}
	rows, err := tx.Query(ctx, w.sql.pendingBefore)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	return ids, tx.Commit(ctx)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// loadHeld reads the aggregates that have rows in the retry lane.
func (w *WALRelay) loadHeld(ctx context.Context) (map[aggregateKey]bool, error) {
	rows, err := w.db.Query(ctx, w.sql.heldAggregates)
	if err != nil {
		return nil, fmt.Errorf("read the aggregates in the retry lane: %w", err)
	}
	held := map[aggregateKey]bool{}
	for rows.Next() {
		var k aggregateKey
		if err := rows.Scan(&k.typ, &k.id); err != nil {
			return nil, err
		}
		held[k] = true
	}
	return held, rows.Err()
}

// dispatcher turns one session's commits into batches, and settles them.
type dispatcher struct {
	w  *WALRelay
	st *walstream.Stream
	// streamServer is the start time of the server the stream reads, streamPID its
	// walsender's process id (see barrier).
	streamServer time.Time
	streamPID    uint32
	// held are the aggregates with rows in the retry lane: their rows are handed there too.
	// Only the dispatcher's goroutine reads or writes it.
	held map[aggregateKey]bool
	// queue holds the rows not yet in a batch, in stream order; inflight the batches sent,
	// in the order they were sent.
	queue    []walRow
	inflight []*walBatch
	ord      int64

	mu        sync.Mutex // guards commits and confirmed
	commits   []*walCommit
	confirmed *pglogrepl.LSN

	lastRefresh time.Time
	// pause is how long to wait before sending again, after rows came back unsent; outage
	// is set while the broker is found unavailable.
	pause  time.Duration
	outage bool
	// waiting counts the batches whose transactions stay in progress past the barrier's
	// bound; barriers ends their wait, when the session ends (see barrier).
	waiting  atomic.Int32
	barriers context.Context
}

func (d *dispatcher) run(ctx context.Context, commits <-chan walstream.Commit, readErr <-chan error) error {
	// A batch whose transactions are not visible yet waits for them until its session ends
	// (barrier): that wait ends first, then the batches in flight are waited for.
	bctx, stopBarriers := context.WithCancel(ctx)
	d.barriers = bctx
	defer func() { stopBarriers(); d.wait() }()
	for {
		if d.pause > 0 {
			if !retry.Sleep(ctx, d.pause) {
				return ctx.Err()
			}
			d.pause = 0
		}
		if err := d.fill(ctx, commits, readErr); err != nil {
			return err
		}
		if d.refreshDue() {
			if err := d.refresh(ctx); err != nil {
				return databaseError{err}
			}
		}
		if len(d.queue) == 0 {
			if err := d.waitOne(ctx, commits, readErr); err != nil {
				return err
			}
			continue
		}
		b := d.next()
		var err error
		for err == nil && d.pause == 0 && d.full() {
			err = d.waitOne(ctx, nil, readErr)
		}
		switch {
		case err != nil:
			return err
		case d.pause > 0: // rows came back unsent: b goes back too, in order
			d.requeue(b.rows)
		default:
			d.send(b)
		}
	}
}

// fill takes in the commits the stream has ready, up to two batches' worth of rows. With
// nothing to do, it waits for one, at most PollInterval (for the refresh).
func (d *dispatcher) fill(ctx context.Context, commits <-chan walstream.Commit, readErr <-chan error) error {
	for len(d.queue) < 2*d.w.cfg.BatchSize {
		select {
		case c := <-commits:
			d.add(c)
			continue
		case err := <-readErr:
			return err
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if len(d.queue) > 0 || len(d.inflight) > 0 {
			return nil
		}
		t := time.NewTimer(d.w.cfg.PollInterval)
		select {
		case c := <-commits:
			d.add(c)
		case err := <-readErr:
			t.Stop()
			return err
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			return nil
		}
		t.Stop()
	}
	return nil
}

// add queues a commit's rows.
func (d *dispatcher) add(c walstream.Commit) {
	wc := &walCommit{end: c.End, xid: c.Xid, at: c.Time, unsettled: len(c.Messages)}
	d.mu.Lock()
	d.commits = append(d.commits, wc)
	if len(d.commits) == 1 {
		d.progress(wc.at)
	}
	d.mu.Unlock()
	for i, m := range c.Messages {
		d.ord++
		d.queue = append(d.queue, walRow{msg: Message(m), unreadable: c.Unreadable[i], commit: wc, ord: d.ord})
	}
}

// next takes the next batch from the queue: up to BatchSize rows.
func (d *dispatcher) next() *walBatch {
	n := min(len(d.queue), d.w.cfg.BatchSize)
	b := &walBatch{rows: slices.Clone(d.queue[:n]), aggs: map[aggregateKey]bool{}, done: make(chan struct{}), released: make(chan struct{})}
	d.queue = d.queue[n:]
	for _, r := range b.rows {
		b.aggs[keyOf(r.msg)] = true
	}
	return b
}

// full reports whether the next batch must wait: InFlightBatches are in flight. A batch in
// flight that holds rows of one of the next batch's aggregates does not hold it back: it is
// sent, runs its barrier, and waits for that batch's release before it publishes (finish).
func (d *dispatcher) full() bool {
	return len(d.inflight) >= d.w.cfg.InFlightBatches
}

// waitOne waits for the oldest batch in flight to end (or for a commit, when commits is
// given, to take it in meanwhile), and collects what ended.
func (d *dispatcher) waitOne(ctx context.Context, commits <-chan walstream.Commit, readErr <-chan error) error {
	if len(d.inflight) == 0 {
		return nil
	}
	select {
	case <-d.inflight[0].done:
	case c := <-commits:
		d.add(c)
	case err := <-readErr:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.collect(ctx)
}

// collect takes the ended batches off the front of inflight and records the aggregates they
// handed to the lane. A batch that came back with rows unsent stops the sending: once every
// batch in flight has ended, their unsent rows go back to the queue, in stream order, and
// pause says how long to wait (the outage backoff when the broker was unavailable). A
// database error ends the session.
func (d *dispatcher) collect(ctx context.Context) error {
	for len(d.inflight) > 0 {
		f := d.inflight[0]
		select {
		case <-f.done:
		default:
			return nil
		}
		if f.err != nil || len(f.untouched) > 0 {
			return d.stop(ctx)
		}
		for _, k := range f.handed {
			d.held[k] = true
		}
		d.inflight = d.inflight[1:]
		if d.outage {
			d.outage = false
			d.w.failures.Succeed(ctx)
			d.w.setState(StateRunning, nil)
		}
	}
	return nil
}

// stop waits for every batch in flight, then puts their unsent rows back (see collect).
func (d *dispatcher) stop(ctx context.Context) error {
	d.wait()
	var back []walRow
	var outage error
	for _, f := range d.inflight {
		for _, k := range f.handed {
			d.held[k] = true
		}
		var dbErr databaseError
		if errors.As(f.err, &dbErr) {
			d.inflight = nil
			return f.err
		}
		back = append(back, f.untouched...)
		outage = cmp.Or(outage, f.err)
	}
	d.inflight = nil
	d.requeue(back)
	d.pause = d.w.cfg.OutageBaseDelay // not sent, the broker not known to be down
	if outage != nil {
		d.outage = true
		d.w.setState(StateBrokerUnavailable, outage)
		d.pause = d.w.failures.Fail(ctx, outage)
	}
	return nil
}

// requeue puts rows back in the queue, in stream order.
func (d *dispatcher) requeue(rows []walRow) {
	d.queue = append(rows, d.queue...)
	slices.SortStableFunc(d.queue, func(a, b walRow) int { return cmp.Compare(a.ord, b.ord) })
}

// wait waits for every batch in flight to end.
func (d *dispatcher) wait() {
	for _, f := range d.inflight {
		<-f.done
	}
}

// refreshDue: the held aggregates are looked at again once per PollInterval.
func (d *dispatcher) refreshDue() bool {
	return len(d.held) > 0 && time.Since(d.lastRefresh) >= d.w.cfg.PollInterval
}

// refresh lets the stream publish again the aggregates whose rows the lane has all settled.
// Only those without a batch in flight are looked at: a batch in flight may still hand one
// of their rows over.
func (d *dispatcher) refresh(ctx context.Context) error {
	d.lastRefresh = time.Now()
	var types, ids []string
	for k := range d.held {
		busy := false
		for _, f := range d.inflight {
			busy = busy || f.aggs[k]
		}
		if !busy {
			types, ids = append(types, k.typ), append(ids, k.id)
		}
	}
	if len(types) == 0 {
		return nil
	}
	rows, err := d.w.db.Query(ctx, d.w.sql.stillHeld, types, ids)
	if err != nil {
		return fmt.Errorf("read the aggregates still in the retry lane: %w", err)
	}
	still := map[aggregateKey]bool{}
	for rows.Next() {
		var k aggregateKey
		if err := rows.Scan(&k.typ, &k.id); err != nil {
			return err
		}
		still[k] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the aggregates still in the retry lane: %w", err)
	}
	for i := range types {
		if k := (aggregateKey{types[i], ids[i]}); !still[k] {
			delete(d.held, k)
		}
	}
	return nil
}

// send starts b on its way: the rows of held aggregates are handed to the lane, the others
// published; both are marked in one transaction, and the slot's position advanced.
func (d *dispatcher) send(b *walBatch) {
	var pub, hand []walRow
	for _, r := range b.rows {
		if d.held[keyOf(r.msg)] {
			hand = append(hand, r)
		} else {
			pub = append(pub, r)
		}
	}
	for _, f := range d.inflight {
		for k := range b.aggs {
			if f.aggs[k] {
				b.preds = append(b.preds, f)
				break
			}
		}
	}
	d.inflight = append(d.inflight, b)
	go func() {
		defer close(b.done)
		d.finish(d.barriers, b, pub, hand)
	}()
}

// finish publishes pub, marks the outcome and hands hand over, then settles what it
// decided. It records in b what the dispatcher needs to know.
//
// It publishes only once every batch before it that holds rows of its aggregates has
// released it: an aggregate's rows reach the broker in commit order, each batch's only after
// the broker confirmed the one before, and they never overtake a row that failed. A batch
// before it that left rows unsent stops it (all its rows go back to the queue, in order);
// one that handed an aggregate to the lane makes it hand that aggregate's rows too.
func (d *dispatcher) finish(session context.Context, b *walBatch, pub, hand []walRow) {
	defer func() {
		select {
		case <-b.released:
		default:
			b.stops = len(b.untouched) > 0 || b.err != nil
			close(b.released)
		}
	}()
	r := d.w.lane
	bound := r.cfg.PublishTimeout + 2*r.cfg.ClaimTimeout
	// The barrier ends with the session: nothing is published yet. What comes after it runs
	// to its end, so that a Run that stops publishes nothing it does not mark.
	berr := d.barrier(session, bound, b.rows)
	ctx := context.WithoutCancel(session)
	if berr != nil {
		b.untouched, b.err = pub, databaseError{berr}
		return
	}
	pub, hand, ok := d.afterPreds(b, pub, hand)
	if !ok {
		b.untouched = append(pub, hand...) // back to the queue, in order, hand included
		return
	}
	// The publish and the marks get their bound once the wait for the batches before is
	// over: that wait is theirs, not this batch's, and must not be blamed on the broker.
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	msgs := make([]Message, len(pub))
	var unreadable map[int]error
	for i, row := range pub {
		msgs[i] = row.msg
		if row.unreadable != nil {
			if unreadable == nil {
				unreadable = map[int]error{}
			}
			unreadable[i] = row.unreadable
		}
	}
	var s settlement
	var spans *batchSpans
	if len(msgs) > 0 {
		spans = r.startSpans(ctx, msgs, time.Now())
		outcomes := r.publish(ctx, time.Now().Add(r.cfg.PublishTimeout), msgs, unreadable, spans)
		confirmedAt := time.Now()
		r.failpoint(FailpointAfterPublish)
		s = settle(msgs, outcomes, r.rowStreaks.of(msgs), r.rules)
		r.rowStreaks.set(msgs, s.streaks)
		s.result.ConfirmedAt = confirmedAt
		s.result.PublishedSpans = r.report(ctx, msgs, &s, spans)
		s.marks.doneTypes, s.marks.doneIDs = nil, nil // nothing waits: the lane runs no maintenance
	}
	var err error
	defer func() { spans.end(s.result.ConfirmedAt, err) }()

	settled := make([]walRow, 0, len(b.rows))
	for i, f := range s.fates {
		switch f.outcome {
		case OutcomeUntouched:
			b.untouched = append(b.untouched, pub[i])
			continue
		case OutcomeFailed, OutcomeDeferred:
			b.handed = append(b.handed, keyOf(pub[i].msg))
		}
		settled = append(settled, pub[i])
	}
	settled = append(settled, hand...)
	if len(b.untouched) == 0 && len(b.handed) == 0 && s.unavailable == nil {
		close(b.released) // all confirmed: the next rows of its aggregates may go out
	}
	if err = d.markVisible(ctx, &s.marks, hand); err != nil {
		b.err = err
		return
	}
	r.failpoint(FailpointAfterCommit)
	if h := r.cfg.Hooks.BatchDone; h != nil && len(msgs) > 0 {
		r.hook(func() { h(s.result) })
	}
	d.settle(settled)
	if s.unavailable != nil {
		b.err = brokerError{fmt.Errorf("publish outbox batch: %w", s.unavailable)}
	}
}

// afterPreds waits until b's predecessors released it, and returns its rows to publish and
// to hand over as their outcomes say; false when one of them stops it.
func (d *dispatcher) afterPreds(b *walBatch, pub, hand []walRow) ([]walRow, []walRow, bool) {
	handed := map[aggregateKey]bool{}
	for _, p := range b.preds {
		<-p.released // once p's barrier passed and the broker answered, or p ended (its barrier waits at most until the session ends)
		if p.stops {
			return pub, hand, false
		}
		for _, k := range p.handed {
			handed[k] = true
		}
	}
	if len(handed) == 0 {
		return pub, hand, true
	}
	keep := pub[:0:0]
	for _, r := range pub {
		if handed[keyOf(r.msg)] {
			hand = append(hand, r)
		} else {
			keep = append(keep, r)
		}
	}
	slices.SortFunc(hand, func(a, b walRow) int { return cmp.Compare(a.ord, b.ord) })
	return keep, hand, true
}

// barrier returns once the rows the stream has sent are on the server's synchronous
// standbys, if it has any, and visible to other transactions: a transaction of its own
// (replicationBarrier, one round trip, within bound) whose commit comes after theirs in the
// WAL, which also reads whether one of the rows' transactions is still in progress.
//
// The stream sends a commit as soon as it is flushed on the primary (PostgreSQL 15's
// walsenders do not wait for the synchronous standbys), and the writer's transaction becomes
// visible only after its wait for the standbys, and a moment after its commit record even
// without them. Publishing before either would be wrong: a failover then would take back a
// row the relay had published, and a consumer's reply could reach the writer's service
// before the row it answers is visible there (an order unknown to its own service, seen
// under chaos).
//
// So a transaction still in progress is waited for, backing off, for as long as it takes:
// a new session would stream it again and wait again. Past bound, the relay blames the
// database (its writers wait for something stricter than the barrier: remote_apply on a
// standby that does not replay, say), logs what they wait for, and waits on; the other
// aggregates' batches go on meanwhile, up to InFlightBatches. Each check also proves that
// the stream's server and walsender are still the ones (barrierHeld). Within bound the
// barrier runs to its end even when ctx, the session's, ends (a stopping Run finishes its
// batches: nothing twice); past bound, ctx's end ends the wait, nothing published.
//
// It must run on the server the stream reads: the pool's connections follow a failover on
// their own (a multi-host URL), and a barrier on the new primary would pass at once for rows
// that the old one alone may have had. A barrier that ran elsewhere fails, as an outage of
// the database: the session ends, and the rows are streamed again from the new primary, if
// it has them.
func (d *dispatcher) barrier(ctx context.Context, bound time.Duration, rows []walRow) error {
	var emitted, ignored *string
	var started time.Time
	var reader *int64
	var running bool
	xids := xidsOf(rows)
	// Within bound, a Run that stops still finishes the batch: a later batch may have gone
	// out already, and would go out again if this one held the slot's position back.
	within := context.WithoutCancel(ctx)
	bctx, cancel := context.WithTimeout(within, bound)
	err := d.w.db.QueryRow(bctx, walBarrier, d.w.wal.Slot, xids).Scan(&emitted, &ignored, &started, &reader, &running)
	cancel()
	if err != nil {
		return fmt.Errorf("wait until the streamed rows are on the synchronous standbys: %w", err)
	}
	if err := d.barrierHeld(started, reader); err != nil {
		return err
	}
	// The check ran before the barrier's own wait for the standbys, after which the writers'
	// commits have ended too, or are about to: ask again at once, then back off.
	deadline := time.Now().Add(bound)
	blamed := false
	defer func() {
		if blamed {
			d.visible()
		}
	}()
	for wait := time.Duration(0); running; wait = min(max(2*wait, time.Millisecond), 100*time.Millisecond) {
		wctx := within
		if time.Now().After(deadline) {
			if !blamed {
				blamed = true
				d.invisible(ctx, bound, xids)
			}
			wctx = ctx // past bound, the session's end ends the wait
		}
		if !retry.Sleep(wctx, wait) {
			return fmt.Errorf("wait until the streamed transactions are visible: %w", context.Cause(wctx))
		}
		qctx, cancel := context.WithTimeout(wctx, bound) // a server that stops answering is an outage
		err := d.w.db.QueryRow(qctx, walVisible, d.w.wal.Slot, xids).Scan(&started, &reader, &running)
		cancel()
		if err != nil {
			return fmt.Errorf("read whether the streamed transactions are visible: %w", err)
		}
		if err := d.barrierHeld(started, reader); err != nil {
			return err
		}
	}
	return nil
}

// errInvisible: streamed transactions stay in progress past the barrier's bound.
var errInvisible = errors.New("streamed transactions are still in progress (committed in the WAL, not visible yet)")

// invisible is called when a batch's transactions are still in progress past bound: the
// first such batch blames the database (state database_unavailable) and logs what the
// writers wait for; visible undoes it once the last such batch goes on.
func (d *dispatcher) invisible(ctx context.Context, bound time.Duration, xids []int64) {
	if d.waiting.Add(1) > 1 {
		return
	}
	var writers []string
	qctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if rows, err := d.w.db.Query(qctx, invisibleWriters, xids); err == nil {
		writers, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	err := fmt.Errorf("%w after %s; their writers: %s", errInvisible, bound, strings.Join(writers, ", "))
	d.w.cfg.Logger.Warn("outbox WAL relay: streamed transactions are still not visible; waiting for them (their writers wait for the synchronous standbys, or for something stricter than the relay's barrier, such as remote_apply)",
		"error", err)
	d.w.setState(StateDatabaseUnavailable, databaseError{err})
}

func (d *dispatcher) visible() {
	if d.waiting.Add(-1) == 0 {
		d.w.cfg.Logger.Info("outbox WAL relay: the streamed transactions it waited for are visible")
		d.w.setState(StateRunning, nil)
	}
}

// invisibleWriters describes the sessions of the transactions $1 (32-bit ids): process id,
// what they wait for, and how long their transaction has run.
const invisibleWriters = `
SELECT format('pid %s (%s: %s, for %s)', pid, coalesce(wait_event_type, 'not waiting'), coalesce(wait_event, '-'),
              date_trunc('second', now() - xact_start))
FROM pg_stat_activity WHERE backend_xid::text::bigint = ANY($1::bigint[])`

// barrierHeld says whether a barrier that ran on the server started at started, where
// reader streams the slot, holds for the stream's batch.
func (d *dispatcher) barrierHeld(started time.Time, reader *int64) error {
	if !started.Equal(d.streamServer) {
		return fmt.Errorf("the replication barrier ran on another server (started %s) than the stream's (started %s): a failover",
			started, d.streamServer)
	}
	// A relay paused past wal_sender_timeout lost its walsender, and a standby may stream
	// the slot now: it publishes these rows, and this batch must not go out beside it.
	if reader == nil || *reader != int64(d.streamPID) {
		return fmt.Errorf("%w: its walsender (pid %d) no longer streams it (now: %s)", errSlotInUse, d.streamPID, pidText(reader))
	}
	return nil
}

func pidText(pid *int64) string {
	if pid == nil {
		return "none"
	}
	return fmt.Sprintf("pid %d", *pid)
}

// walHeld reads the server's start time, the process that streams slot $1 now, and
// whether one of the transactions $2 is still in progress (xactsInProgress).
var walHeld = "pg_postmaster_start_time(),\n       (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1),\n       (" +
	mustReplace(xactsInProgress, "$1", "$2") + ")"

// walBarrier is replicationBarrier, and walHeld; walVisible is walHeld alone.
var (
	walBarrier = mustReplace(replicationBarrier, "pg_postmaster_start_time()", walHeld)
	walVisible = "SELECT " + walHeld
)

// errNotVisible: a mark found fewer of the batch's rows than it marks.
var errNotVisible = errors.New("rows streamed are not in the table")

// markVisible marks the batch. Its barrier waited until the rows' transactions were
// visible, so a row the mark misses is gone (deleted by hand, or by the transaction that
// inserted it): it marks the others and logs it.
//
// With [Config].DeletePublished a row missing is no news: a restart streams again rows
// published and deleted before it (the window of WALRelay's comment), which every
// statement then misses. It marks non-strictly at once.
func (d *dispatcher) markVisible(ctx context.Context, m *marks, hand []walRow) error {
	err := d.mark(ctx, m, hand, !d.w.cfg.DeletePublished)
	if !errors.Is(err, errNotVisible) {
		return err
	}
	d.w.cfg.Logger.Warn("outbox WAL relay: streamed rows are no longer in the table (deleted, by hand or by the transaction that inserted them); the others are marked", "error", err)
	return d.mark(ctx, m, hand, false)
}

// xactsInProgress reports whether one of the transactions $1 (32-bit ids, as the stream has
// them) is still in progress: committed in the WAL, not yet visible to others.
const xactsInProgress = `
WITH cur AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x),
` + widenXids + `
SELECT coalesce(bool_or(pg_xact_status(w.id::text::xid8) = 'in progress'), false) FROM w`

// widenXids widens the 32-bit ids $1 to xid8 (w.id), each as the xid8 nearest cur.x, the
// current snapshot's xmax (within 2^31 of it): the epoch of xmax, or the one before or after
// it across a wrap. A streamed transaction's id can be at or above xmax, which only counts
// completed transactions: taking it for one of the epoch before (as an earlier version did)
// named a transaction from the future, or from the past, whose status is not this one's.
const widenXids = `c AS (SELECT ((cur.x >> 32) << 32) | v.xid AS id, cur.x FROM cur, unnest($1::bigint[]) AS v(xid)),
w AS (SELECT CASE WHEN c.id - c.x > 2147483648 THEN c.id - 4294967296
                  WHEN c.x - c.id > 2147483648 THEN c.id + 4294967296
                  ELSE c.id END AS id FROM c)`

// xidsOf returns the distinct transactions of rows.
func xidsOf(rows []walRow) []int64 {
	xids := make([]int64, 0, 1)
	seen := make(map[uint32]bool, 1)
	for _, r := range rows {
		if x := r.commit.xid; !seen[x] {
			seen[x] = true
			xids = append(xids, int64(x))
		}
	}
	return xids
}

// mark records a batch's marks, and hands hand over, in one transaction. When strict, it rolls
// back when a statement finds fewer rows than it marks (errNotVisible).
func (d *dispatcher) mark(ctx context.Context, m *marks, hand []walRow, strict bool) error {
	r := d.w.lane
	if len(m.published)+len(m.failed.ids)+len(m.deferred.ids)+len(hand) == 0 {
		return nil
	}
	tx, err := d.w.db.Begin(ctx)
	if err != nil {
		return databaseError{fmt.Errorf("mark outbox batch: begin: %w", err)}
	}
	defer rollback(ctx, tx)
	// The marks must land where the rows were streamed from. Two servers may take writes
	// at once (an old primary cut off by the network, healed before it was fenced): a pool
	// connection on the other one would find none of the rows, take them for deleted, and
	// the slot would move past rows never marked, pending for ever.
	var started time.Time
	if err := tx.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
		return databaseError{fmt.Errorf("mark outbox batch: %w", err)}
	}
	if !started.Equal(d.streamServer) {
		return databaseError{fmt.Errorf("mark outbox batch: the marks would run on another server (started %s) than the stream's (started %s): a failover, or two primaries",
			started, d.streamServer)}
	}
	short := func(what string, tag pgconn.CommandTag, want int) error {
		if n := tag.RowsAffected(); strict && n < int64(want) {
			return databaseError{fmt.Errorf("%s: %d of %d: %w", what, n, want, errNotVisible)}
		}
		return nil
	}
	if len(m.published) > 0 {
		tag, err := r.markConfirmed(ctx, tx, m.published)
		if err != nil {
			return databaseError{fmt.Errorf("mark %d outbox rows published: %w", len(m.published), err)}
		}
		if err := short("mark outbox rows published", tag, len(m.published)); err != nil {
			return err
		}
	}
	if f := &m.failed; len(f.ids) > 0 {
		tag, err := tx.Exec(ctx, r.sql.markFailed, f.ids, f.errs, f.delays, f.dead)
		if err != nil {
			return databaseError{fmt.Errorf("mark %d outbox rows failed: %w", len(f.ids), err)}
		}
		if err := short("mark outbox rows failed", tag, len(f.ids)); err != nil {
			return err
		}
	}
	if f := &m.deferred; len(f.ids) > 0 {
		tag, err := tx.Exec(ctx, r.sql.markDeferred, f.ids, f.errs, f.delays)
		if err != nil {
			return databaseError{fmt.Errorf("defer %d outbox rows: %w", len(f.ids), err)}
		}
		if err := short("defer outbox rows", tag, len(f.ids)); err != nil {
			return err
		}
	}
	if len(hand) > 0 {
		ids := make([]pgtype.UUID, len(hand))
		for i, row := range hand {
			ids[i] = pgtype.UUID{Bytes: row.msg.ID, Valid: true}
		}
		var seen int64
		if err := tx.QueryRow(ctx, d.w.sql.markHeld, ids, reasonHeld).Scan(&seen); err != nil {
			return databaseError{fmt.Errorf("hand %d outbox rows to the retry lane: %w", len(hand), err)}
		}
		if strict && seen < int64(len(hand)) {
			return databaseError{fmt.Errorf("hand outbox rows to the retry lane: %d of %d: %w", seen, len(hand), errNotVisible)}
		}
	}
	r.failpoint(FailpointAfterMark)
	if err := tx.Commit(ctx); err != nil {
		return databaseError{fmt.Errorf("commit outbox batch: %w", err)}
	}
	return nil
}

// settle counts rows settled against their commits, and advances the slot's position past
// the commits at the front that are all settled.
func (d *dispatcher) settle(rows []walRow) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rows {
		r.commit.unsettled--
	}
	n := 0
	for n < len(d.commits) && d.commits[n].unsettled == 0 {
		*d.confirmed = d.commits[n].end
		n++
	}
	if n > 0 {
		d.commits = d.commits[n:]
		d.st.Advance(*d.confirmed)
		var oldest time.Time
		if len(d.commits) > 0 {
			oldest = d.commits[0].at
		}
		d.progress(oldest)
	}
}

// progress reports the oldest transaction streamed and not settled (Hooks.WALProgress).
// The caller holds d.mu, so that the reports come in order.
func (d *dispatcher) progress(oldest time.Time) {
	if h := d.w.cfg.Hooks.WALProgress; h != nil {
		d.w.lane.hook(func() { h(WALProgress{Oldest: oldest}) })
	}
}

// storeOf returns a Store of the relay's statements, for its checks.
func (r *Relay) storeOf() *Store {
	return &Store{tables: r.cfg.Tables, sql: r.sql}
}
