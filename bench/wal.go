package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// The relays of item 10.
const (
	RelayPoll = "poll" // outbox.Relay, pipelined
	RelayWAL  = "wal"  // outbox.WALRelay
	RelayNone = "none" // no relay running (the writers' reference)
	// RelayWALDelete is outbox.WALRelay with Config.DeletePublished: the rows it publishes
	// are deleted, not marked.
	RelayWALDelete = "wal-delete"
)

// isWAL tells whether relay is a WAL relay.
func isWAL(relay string) bool { return relay == RelayWAL || relay == RelayWALDelete }

// WALResult is item 10: the WAL relay beside the polling relay, both on a private
// PostgreSQL server at wal_level=logical that the run starts and removes (the configured
// server keeps its settings), against limit A of the same run.
type WALResult struct {
	// Server is the private server's version and settings.
	Server string
	// Batch is both relays' batch size; InFlight their batches in flight.
	Batch, InFlight int
	// Drains: each relay drains a backlog spread over as many aggregates, then one of a
	// single aggregate.
	Drains []WALDrain
	// Latency: each relay at [TargetLatencyRate] orders/s, then the WAL relay at 80% of
	// [WALResult.SustainableRate] for SustainedDuration.
	Latency []LatencyResult
	// Writers: limit B's order transaction with no relay, then each relay running.
	Writers []WALWriters
	// Kill is the WAL relay process killed mid-drain and started again.
	Kill *WALKill
	// Err: the private server could not be started, or set up.
	Err error
}

// WALDrain is one drain of item 10.
type WALDrain struct {
	Relay string
	// Hot: every row is of one aggregate.
	Hot bool
	// Rows is the backlog; Published the rows published in the measured span, all of them
	// unless the drain met its time bound (Bounded: the polling relay's hot aggregate).
	Rows, Published int
	Bounded         bool
	Rate            float64
	CPU             *CPUUsage
	Err             error
}

// WALWriters is limit B's order transaction with Writers writers while Relay relays.
type WALWriters struct {
	Relay   string
	Writers int
	Rate    float64
	Err     error
}

// WALKill is the WAL relay process SIGKILLed once the queue received about half of Rows,
// then started again.
type WALKill struct {
	Rows int
	// KilledAt is how many messages the queue had received when the kill was sent;
	// Received how many it received in all, Duplicates the ones above Rows.
	KilledAt, Received, Duplicates int64
	// FirstPublish is the time from the second process's start to its first batch
	// published; Drained from the kill to the last row published.
	FirstPublish, Drained time.Duration
	Err                   error
}

// walServerSettings are the private server's settings: the machine's shared server's
// (fsync on, 128 MB of shared buffers) at wal_level=logical, with room for the slots.
var walServerSettings = []string{
	"-c", "wal_level=logical", "-c", "fsync=on", "-c", "shared_buffers=128MB",
	"-c", "max_wal_senders=10", "-c", "max_replication_slots=10", "-c", "max_connections=200",
}

// walPhase is item 10. It starts the private server, measures on it, and removes it.
func (e *env) walPhase(ctx context.Context, s Sizes, batch, inFlight int) *WALResult {
	res := &WALResult{Batch: batch, InFlight: inFlight}
	e.progress("item 10: starting a private PostgreSQL at wal_level=logical")
	srv, stop, err := testinfra.StartServer(walServerSettings...)
	defer stop()
	if err != nil {
		res.Err = fmt.Errorf("start a private PostgreSQL server (the WAL relay needs wal_level=logical): %w", err)
		return res
	}
	cfg := e.cfg
	cfg.PostgresURL = srv.URL("postgres")
	pe := newEnv(cfg)
	// An id of its own: its exchanges and queues are on the same broker as the run's, and
	// item 5's warehouse consumer, still running, would take its messages.
	pe.id, pe.start, pe.log = e.id+"w", e.start, e.log
	defer func() { _ = pe.close(ctx) }()
	res.Server = pe.serverVersion(ctx) + ", wal_level=logical, fsync on, shared_buffers 128MB, no standby"

	for _, hot := range []bool{false, true} {
		for _, relay := range []string{RelayPoll, RelayWAL, RelayWALDelete} {
			if ctx.Err() != nil {
				return res
			}
			rows, bound := s.Backlog, time.Duration(0)
			if hot && relay == RelayPoll {
				bound = s.HotPollBound // one row per cycle: bounded in time
			}
			e.progress("item 10: %s relay drains %s rows%s", relay, FormatCount(rows), hotText(hot))
			d := pe.walDrain(ctx, relay, hot, rows, batch, inFlight, bound)
			res.Drains = append(res.Drains, d)
			e.progress("  %s", resultOrError(fmt.Sprintf("%s (%s published); CPU per 1,000: %s", FormatRate(d.Rate, "rows/s"),
				FormatCount(d.Published), FormatCPU(d.CPU, "relay")), d.Err))
		}
	}

	for _, relay := range []string{RelayNone, RelayPoll, RelayWAL} {
		if ctx.Err() != nil {
			return res
		}
		e.progress("item 10: limit B, %d writers, %s relay, for %s", latencyWriters, relay, s.LimitDuration)
		w := pe.walWriters(ctx, relay, latencyWriters, s.Backlog, batch, inFlight, s.LimitDuration)
		res.Writers = append(res.Writers, w)
		e.progress("  %s", resultOrError(FormatRate(w.Rate, "tx/s"), w.Err))
	}

	rig, err := pe.newLatencyRig(ctx)
	for _, relay := range []string{RelayPoll, RelayWAL} {
		if ctx.Err() != nil {
			return res
		}
		e.progress("item 10: %d orders/s, %s relay, %s after %s warm-up", TargetLatencyRate, relay, s.RateDuration, s.Warmup)
		r := LatencyResult{Rate: TargetLatencyRate, Notify: true, Relay: relay, Err: err}
		if err == nil {
			r = rig.run(ctx, TargetLatencyRate, true, TracingOff, s.Warmup, s.RateDuration, relay)
		}
		res.Latency = append(res.Latency, r)
		e.progress("  confirm %s; reserved %s", resultOrError(FormatLatencies(r.Confirm), r.Err), FormatLatencies(r.Reserved))
	}
	if ctx.Err() == nil {
		rate := int(TargetWALSustainedOfDrain*res.SustainableRate()) / 10 * 10
		e.progress("item 10: sustained, %d orders/s, WAL relay, for %s", rate, s.SustainedDuration)
		r := LatencyResult{Rate: rate, Notify: true, Relay: RelayWAL, Sustained: true, Err: err}
		if rate < 10 {
			r.Err = errors.Join(err, errors.New("neither the WAL relay's drain nor the writers beside it were measured in this run"))
		} else if err == nil {
			// Commit→confirm alone: the warehouse's consumer, which cannot keep up with the
			// writers on a small machine, would take the CPU the relay is measured with. The
			// queue keeps what is published; the run's reset purges it.
			rig.stopConsum()
			r = rig.run(ctx, rate, true, TracingOff, s.Warmup, s.SustainedDuration, RelayWAL)
			r.Sustained = true
		}
		res.Latency = append(res.Latency, r)
		e.progress("  confirm %s", resultOrError(FormatLatencies(r.Confirm), r.Err))
	}
	if rig != nil {
		rig.stopConsum()
		_ = pe.dropSlots(ctx, pe.dbName("lat_orders"))
	}

	if ctx.Err() == nil {
		e.progress("item 10: WAL relay process killed mid-drain of %s rows, then started again", FormatCount(s.Backlog))
		k := pe.walKill(ctx, s.Backlog, batch)
		res.Kill = &k
		e.progress("  %s", resultOrError(fmt.Sprintf("%d duplicates, first publish %s after the restart", k.Duplicates, FormatLatency(k.FirstPublish)), k.Err))
	}
	return res
}

func hotText(hot bool) string {
	if hot {
		return ", all of one aggregate"
	}
	return ""
}

// SustainableRate is what the sustained run is a share of: the WAL relay's drain of the
// spread backlog, or, when lower (on a small machine the writers are the ceiling), the
// writers' rate with the WAL relay publishing; 0 when neither was measured.
func (r *WALResult) SustainableRate() float64 {
	rate := r.drainRate(RelayWAL, false)
	for _, w := range r.Writers {
		if w.Relay == RelayWAL && w.Err == nil && (rate == 0 || w.Rate < rate) {
			rate = w.Rate
		}
	}
	return rate
}

// drainRate is the rate of the drain of relay, or 0.
func (r *WALResult) drainRate(relay string, hot bool) float64 {
	for _, d := range r.Drains {
		if d.Relay == relay && d.Hot == hot && d.Err == nil {
			return d.Rate
		}
	}
	return 0
}

// serverVersion reads the server's version number, or says why it could not.
func (e *env) serverVersion(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, e.cfg.PostgresURL)
	if err != nil {
		return "PostgreSQL (version unknown)"
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "PostgreSQL (version unknown)"
	}
	return "PostgreSQL " + strings.Fields(v)[0]
}

// walBacklogTable holds the backlog outside the outbox: rows written to the outbox before
// the WAL relay's slot exists are handed to its retry lane, not streamed, so every drain of
// item 10 moves the backlog into the outbox after the slot is made (both relays alike).
const (
	walBacklogTable = `CREATE TABLE bench_backlog AS SELECT * FROM outbox_messages ORDER BY seq;
TRUNCATE outbox_messages`
	walHot       = `UPDATE bench_backlog SET aggregate_type = 'customer', aggregate_id = 'hot'`
	walMoveChunk = `INSERT INTO outbox_messages (id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers)
SELECT id, exchange, routing_key, type, aggregate_type, aggregate_id, payload, headers
FROM bench_backlog WHERE seq > $1 AND seq <= $2 ORDER BY seq`
	walPending = `SELECT count(*) FROM outbox_messages WHERE published_at IS NULL AND dead_at IS NULL`
)

// walTemplate returns the database item 10 copies: the outbox schema with its publication,
// and the backlog of rows rows in bench_backlog.
func (e *env) walTemplate(ctx context.Context, rows int) (string, topology, error) {
	name, top, err := e.backlog(ctx, rows)
	if err != nil {
		return "", topology{}, err
	}
	e.setupMu.Lock()
	defer e.setupMu.Unlock()
	if e.walTemplateDB != "" {
		return e.walTemplateDB, top, nil
	}
	dbURL, err := e.databaseURL(name)
	if err != nil {
		return "", topology{}, err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", topology{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // a template must have no connections
	if _, err := conn.Exec(ctx, walBacklogTable); err != nil {
		return "", topology{}, fmt.Errorf("move the backlog aside: %w", err)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE bench_backlog"); err != nil {
		return "", topology{}, fmt.Errorf("vacuum analyze the backlog: %w", err)
	}
	if err := createPublication(ctx, conn); err != nil {
		return "", topology{}, err
	}
	e.walTemplateDB = name
	return name, top, nil
}

// walDB is a database of item 10: a copy of the template, with the backlog of one
// aggregate when hot, and its pool named appName.
type walDB struct {
	name, url, appName string
	pool               *pgxpool.Pool
	top                topology
}

func (e *env) newWALDB(ctx context.Context, suffix string, rows int, hot bool, conns int32) (*walDB, error) {
	template, top, err := e.walTemplate(ctx, rows)
	if err != nil {
		return nil, err
	}
	dbURL, err := e.createDatabase(ctx, suffix, template)
	if err != nil {
		return nil, err
	}
	db := &walDB{name: e.dbName(suffix), top: top, appName: fmt.Sprintf("bench-%s-%s-", e.id, suffix)}
	if db.url, err = withAppName(dbURL, db.appName+"relay"); err != nil {
		return nil, err
	}
	if db.pool, err = openPool(ctx, db.url, conns); err != nil {
		return nil, err
	}
	if hot {
		if _, err := db.pool.Exec(ctx, walHot); err != nil {
			return nil, fmt.Errorf("one aggregate: %w", err)
		}
	}
	return db, nil
}

func (db *walDB) close(ctx context.Context, e *env) {
	db.pool.Close()
	ctx = context.WithoutCancel(ctx)
	_ = e.dropSlots(ctx, db.name)
	_ = e.dropDatabase(ctx, db.name) // free the disk now
}

// dropSlotsSQL drops the replication slots of database $1, ending the walsender of one still
// in use (a relay just stopped): a database with a slot cannot be dropped, and the slot keeps
// the WAL.
const dropSlotsSQL = `SELECT count(pg_terminate_backend(active_pid)) FILTER (WHERE active),
       count(pg_drop_replication_slot(slot_name)) FILTER (WHERE NOT active)
FROM pg_replication_slots WHERE database = $1`

// dropSlots drops the replication slots of database name, within 10 s.
func (e *env) dropSlots(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, e.cfg.PostgresURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) { // a walsender ending
		var active, dropped int
		err := conn.QueryRow(ctx, dropSlotsSQL, name).Scan(&active, &dropped)
		if err == nil && active == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop the replication slots of %s: %d still in use (%v)", name, active, err)
		}
	}
}

// slot makes the WAL relay's slot: a WAL relay runs until it streams.
func (db *walDB) slot(ctx context.Context, e *env) error {
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: e.cfg.AMQPURL, ConnectionName: "bench-" + e.id + "-slot", Logger: e.log})
	if err != nil {
		return err
	}
	defer pub.Close()
	w, err := outbox.NewWALRelay(db.pool, pub, outbox.Config{Logger: e.log}, outbox.WALConfig{URL: db.url})
	if err != nil {
		return err
	}
	return runUntilStreaming(ctx, w, func() {})
}

// runUntilStreaming runs w until it streams, calls then, and stops it.
func runUntilStreaming(ctx context.Context, w *outbox.WALRelay, then func()) error {
	rctx, cancel := context.WithCancel(ctx)
	ran, err := startStreaming(rctx, w)
	defer func() { cancel(); <-ran }()
	if err != nil {
		return err
	}
	then()
	return nil
}

// startStreaming runs w until ctx ends, and returns once it streams, with the channel closed
// when Run returned; or with an error, when Run returned before it streamed (with Run's
// error), ctx ended, or a minute passed.
func startStreaming(ctx context.Context, w *outbox.WALRelay) (<-chan struct{}, error) {
	ran := make(chan struct{})
	var runErr error
	go func() { defer close(ran); runErr = w.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for w.State() != outbox.StateRunning {
		select {
		case <-ran:
			return ran, fmt.Errorf("the WAL relay stopped before it streamed: %w", runErr)
		case <-ctx.Done():
			return ran, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling the relay's state
		}
		if time.Now().After(deadline) {
			return ran, errors.New("the WAL relay did not stream within a minute")
		}
	}
	return ran, nil
}

// createPublication makes the publication of the default outbox table for the WAL relay
// (nothing when it exists).
func createPublication(ctx context.Context, db outbox.DBTX) error {
	store, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		return err
	}
	return store.CreatePublication(ctx, db, "")
}

// move writes the backlog into the outbox, in transactions of 1,000 rows, as fillBacklog
// wrote it, and analyses the table.
func (db *walDB) move(ctx context.Context, rows int) error {
	var first int64
	if err := db.pool.QueryRow(ctx, "SELECT coalesce(min(seq), 1) - 1 FROM bench_backlog").Scan(&first); err != nil {
		return fmt.Errorf("read the backlog: %w", err)
	}
	for from := first; from < first+int64(rows); from += 1000 {
		if _, err := db.pool.Exec(ctx, walMoveChunk, from, from+1000); err != nil {
			return fmt.Errorf("move the backlog into the outbox: %w", err)
		}
	}
	_, err := db.pool.Exec(ctx, "VACUUM ANALYZE outbox_messages")
	return err
}

// fill readies db for a drain by relay: the WAL relay's slot first, then the backlog of rows
// rows in the outbox; and returns the sink of its queue.
func (db *walDB) fill(ctx context.Context, e *env, relay string, rows int) (*sink, error) {
	if isWAL(relay) {
		if err := db.slot(ctx, e); err != nil {
			return nil, err
		}
	}
	if err := db.move(ctx, rows); err != nil {
		return nil, err
	}
	return e.startSink(db.top.Queue, 200*time.Millisecond)
}

// newRelay makes a relay of kind relay on db's pool.
func (e *env) newRelay(db *walDB, relay string, pub outbox.Publisher, cfg outbox.Config) (interface {
	Run(context.Context) error
}, error) {
	if isWAL(relay) {
		walURL, err := withAppName(db.url, db.appName+"walsender")
		if err != nil {
			return nil, err
		}
		cfg.DeletePublished = relay == RelayWALDelete
		return outbox.NewWALRelay(db.pool, pub, cfg, outbox.WALConfig{URL: walURL})
	}
	cfg.DisableNotify = true
	return outbox.NewRelay(db.pool, pub, cfg)
}

// walDrain drains a backlog of rows rows with relay, from its start until the BatchDone
// hooks counted every row published, or bound passed (0: every row). The CPU of the bench's
// process, of the relay's backends (the walsender too) and of the broker is sampled around
// the same span.
func (e *env) walDrain(ctx context.Context, relay string, hot bool, rows, batch, inFlight int, bound time.Duration) WALDrain {
	res := WALDrain{Relay: relay, Hot: hot, Rows: rows}
	suffix := fmt.Sprintf("wal_drain_%s_%t", relay, hot)
	db, err := e.newWALDB(ctx, suffix, rows, hot, int32(2*inFlight+2))
	if err != nil {
		res.Err = err
		return res
	}
	defer db.close(ctx, e)
	snk, err := db.fill(ctx, e, relay, rows)
	if err != nil {
		res.Err = err
		return res
	}
	defer snk.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: e.cfg.AMQPURL, ConnectionName: "bench-" + e.id + "-" + suffix,
		Connections: inFlight, Logger: e.log})
	if err != nil {
		res.Err = err
		return res
	}
	defer pub.Close()
	var (
		published atomic.Int64
		done      = make(chan struct{})
		once      sync.Once
	)
	r, err := e.newRelay(db, relay, pub, outbox.Config{BatchSize: batch, InFlightBatches: inFlight, Logger: e.log,
		Hooks: outbox.Hooks{BatchDone: func(b outbox.BatchResult) {
			if published.Add(int64(len(b.Published))) >= int64(rows) {
				once.Do(func() { close(done) })
			}
		}}})
	if err != nil {
		res.Err = err
		return res
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	meter := e.startCPU(ctx, db.appName)
	start := time.Now()
	go func() { defer close(ran); _ = r.Run(runCtx) }()
	limit := drainTimeout(rows)
	if bound > 0 {
		limit = bound
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(limit):
	}
	elapsed := time.Since(start)
	n := min(published.Load(), int64(rows))
	cpu := meter.stop(ctx, int(n))
	stop()
	<-ran
	res.Published, res.CPU, res.Rate = int(n), cpu, float64(n)/elapsed.Seconds()
	switch {
	case ctx.Err() != nil:
		res.Err = ctx.Err()
	case n < int64(rows) && bound == 0:
		res.Err = fmt.Errorf("drained %d of %d rows within %s", n, rows, limit)
	case n < int64(rows):
		res.Bounded = true
	}
	if res.Err == nil {
		if got, _, err := snk.waitFor(ctx, n, 30*time.Second); err != nil {
			res.Err = fmt.Errorf("the relay reported %d rows published but the queue received %d: %w", n, got, err)
		}
	}
	return res
}

// walWriters is limit B's order transaction with writers writers for d, while relay (or
// none) publishes what they write, the queue purged as it fills. The database is a copy of
// the template of backlog rows, the backlog left aside.
func (e *env) walWriters(ctx context.Context, relay string, writers, backlog, batch, inFlight int, d time.Duration) WALWriters {
	res := WALWriters{Relay: relay, Writers: writers}
	db, err := e.newWALDB(ctx, "wal_writers_"+relay, backlog, false, int32(2*inFlight+2))
	if err != nil {
		res.Err = err
		return res
	}
	defer db.close(ctx, e)
	if _, err := db.pool.Exec(ctx, ordersTable); err != nil {
		res.Err = fmt.Errorf("create orders table: %w", err)
		return res
	}
	measure := func() { res.Rate, res.Err = e.txLimit(ctx, db.url, db.top.Exchange, writers, d) }
	if relay == RelayNone {
		measure()
		return res
	}
	snk, err := e.startSink(db.top.Queue, 200*time.Millisecond)
	if err != nil {
		res.Err = err
		return res
	}
	defer snk.Close()
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: e.cfg.AMQPURL, ConnectionName: "bench-" + e.id + "-writers-" + relay,
		Connections: inFlight, Logger: e.log})
	if err != nil {
		res.Err = err
		return res
	}
	defer pub.Close()
	r, err := e.newRelay(db, relay, pub, outbox.Config{BatchSize: batch, InFlightBatches: inFlight, Logger: e.log})
	if err != nil {
		res.Err = err
		return res
	}
	if w, ok := r.(*outbox.WALRelay); ok {
		err = runUntilStreaming(ctx, w, measure)
		res.Err = errors.Join(res.Err, err)
		return res
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = r.Run(runCtx) }()
	measure()
	stop()
	<-ran
	return res
}

// walKill runs the WAL relay as a process of its own (bench/cmd/relay -wal) on a backlog of
// rows rows, SIGKILLs it once the queue received about half of them, starts it again, and
// waits until every row is published: the queue's count above rows is the duplicates.
func (e *env) walKill(ctx context.Context, rows, batch int) WALKill {
	res := WALKill{Rows: rows}
	bin, cleanup, err := e.relayBinary(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	defer cleanup()
	db, err := e.newWALDB(ctx, "wal_kill", rows, false, int32(2*outbox.DefaultInFlightBatches+2))
	if err != nil {
		res.Err = err
		return res
	}
	defer db.close(ctx, e)
	snk, err := db.fill(ctx, e, RelayWAL, rows)
	if err != nil {
		res.Err = err
		return res
	}
	defer snk.Close()
	start := func() (*exec.Cmd, <-chan string, error) {
		return startProcess(ctx, nil, bin, "-database-url", db.url, "-amqp-url", e.cfg.AMQPURL,
			"-batch", strconv.Itoa(batch), "-wal-url", db.url, "-first")
	}
	first, _, err := start()
	if err != nil {
		res.Err = err
		return res
	}
	res.KilledAt, _, err = snk.waitFor(ctx, int64(rows/2), drainTimeout(rows))
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	killedAt := time.Now()
	if err != nil {
		res.Err = err
		return res
	}
	startedAt := time.Now()
	second, lines, err := start()
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() }()
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, "published") {
			res.Err = fmt.Errorf("the relay process said %q, not that it published", line)
			return res
		}
		res.FirstPublish = time.Since(startedAt)
	case <-time.After(time.Minute):
		res.Err = errors.New("the restarted relay published nothing within a minute")
		return res
	case <-ctx.Done():
		res.Err = ctx.Err()
		return res
	}
	// Every row is published once none is pending: the relay publishes before it marks.
	deadline := time.Now().Add(drainTimeout(rows))
	for {
		var pending int64
		if err := db.pool.QueryRow(ctx, walPending).Scan(&pending); err != nil {
			res.Err = err
			return res
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			res.Err = errors.Join(ctx.Err(), fmt.Errorf("%d rows still pending %s after the restart", pending, drainTimeout(rows)))
			return res
		}
		time.Sleep(50 * time.Millisecond) // polling the table
	}
	res.Drained = time.Since(killedAt)
	if res.Received, err = snk.Count(); err != nil {
		res.Err = err
		return res
	}
	if res.Received < int64(rows) {
		res.Err = fmt.Errorf("the queue received %d of %d rows: lost", res.Received, rows)
	}
	res.Duplicates = res.Received - int64(rows)
	return res
}
