package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- the primary and its synchronous standby (local target) ----

// standbyName is the standby's application_name (its cluster_name), which the primary's
// synchronous_standby_names waits for.
const standbyName = "orders-standby"

// pgPair is a PostgreSQL primary with a synchronous streaming standby, made for one shop:
// the primary a copy of another server, the standby from pg_basebackup -R of it.
type pgPair struct {
	dir              string
	primary, standby *pgServer
	// promoted is set once the standby was promoted: the old primary may not start again.
	promoted atomic.Bool
}

// startPGPair makes the primary a copy of template (pg_basebackup, without -R: a server of
// its own; an initdb takes several times as long on a loaded machine), starts it, clones the
// standby from it with pg_basebackup -R, starts that, and returns once the primary streams to
// it synchronously. The pair is returned also on error, for remove.
//
// On a network lab (lab not nil), the primary runs on HostOrdersPrimary and the standby on
// HostOrdersStandby, each in its namespace.
func startPGPair(ctx context.Context, dir string, template *pgServer, lab *shopLab) (*pgPair, error) {
	p := &pgPair{dir: dir}
	var err error
	if p.primary, err = newPGServer("orders-db-primary", filepath.Join(dir, "primary")); err != nil {
		return p, err
	}
	if p.standby, err = newPGServer("orders-db-standby", filepath.Join(dir, "standby")); err != nil {
		return p, err
	}
	// Only the primary's command line names the synchronous standby: once promoted, the
	// standby has none to wait for, and its commits return at once.
	p.primary.args = []string{"-c", "cluster_name=orders-primary", "-c", "synchronous_standby_names=FIRST 1 (\"" + standbyName + "\")"}
	p.standby.args = []string{"-c", "cluster_name=" + standbyName}
	if err := p.primary.clone(ctx, template, false); err != nil {
		return p, err
	}
	if lab != nil {
		if err := lab.place(p.primary, HostOrdersPrimary); err != nil {
			return p, err
		}
	}
	if err := p.primary.start(ctx); err != nil {
		return p, err
	}
	if err := p.standby.clone(ctx, p.primary, true); err != nil {
		return p, err
	}
	if lab != nil {
		if err := lab.place(p.standby, HostOrdersStandby); err != nil {
			return p, err
		}
	}
	if err := p.standby.start(ctx); err != nil {
		return p, err
	}
	conn, err := pgx.Connect(ctx, p.primary.URL("postgres"))
	if err != nil {
		return p, fmt.Errorf("%s: %w", p.primary.name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = poll(wctx, 50*time.Millisecond, func() (bool, error) {
		var state string
		err := conn.QueryRow(wctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standbyName).Scan(&state)
		return err == nil && state == "sync", nil
	})
	if err != nil {
		return p, fmt.Errorf("the standby never became synchronous (see %s): %w", p.standby.logPath, err)
	}
	return p, nil
}

// clone makes the server's data directory a copy of from's with pg_basebackup; standby
// makes it a standby streaming from from (-R: standby.signal and primary_conninfo).
func (s *pgServer) clone(ctx context.Context, from *pgServer, standby bool) error {
	if err := s.acct.mkdirOwned(s.dir); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	args := []string{"-h", from.host(), "-p", strconv.Itoa(from.port), "-U", "postgres",
		"-D", filepath.Join(s.dir, "data"), "-X", "stream", "--no-sync", "--checkpoint=fast"}
	if standby {
		args = append(args, "-R")
	}
	return s.run(ctx, "pg_basebackup", args...)
}

// URL is the multi-host URL of database db: both servers, target_session_attrs=read-write.
func (p *pgPair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		p.primary.addr(), p.standby.addr(), db)
}

// remove kills both servers and deletes their directories.
func (p *pgPair) remove(ctx context.Context) error {
	var errs []error
	for _, s := range []*pgServer{p.primary, p.standby} {
		if s != nil {
			errs = append(errs, s.kill(ctx))
		}
	}
	return errors.Join(append(errs, os.RemoveAll(p.dir))...)
}

// run runs one of the PostgreSQL programs (pg_basebackup, pg_ctl) as the server's user.
func (s *pgServer) run(ctx context.Context, program string, args ...string) error {
	// Beside initdb (through its link: /usr/local/bin may link some programs only), not
	// through PATH, where Debian's pg_wrapper may stand instead.
	initdb, err := filepath.EvalSymlinks(s.initdb)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	bin := filepath.Join(filepath.Dir(initdb), program)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = groupAttr(s.acct)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "PGSSLMODE=disable"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %s: %w\n%s", s.name, program, err, out)
	}
	return nil
}

// ordersPair is the current shop's pair, nil when its orders database has no standby.
func (l *Local) ordersPair() *pgPair {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop == nil {
		return nil
	}
	return l.shop.ordersPair
}

// Promote implements Target: pg_ctl promote on the standby, waiting until it takes writes.
func (l *Local) Promote(ctx context.Context, c Component) error {
	pair := l.ordersPair()
	if c != OrdersDB || pair == nil {
		return fmt.Errorf("promote a standby of %s: %w: the shop has none", c, ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if pair.primary.running() && !l.primaryCutOff() {
		// Two primaries would split the brain: the old one must be gone first, or cut off
		// from the standby (a network partition, where fencing the old primary is the
		// failover manager's next duty).
		return fmt.Errorf("promote the standby of %s: the primary is running", c)
	}
	pair.promoted.Store(true)
	return pair.standby.run(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", filepath.Join(pair.standby.dir, "data"))
}

// ---- the scenario ----

// Timings of pg-failover.
const (
	// failoverRelayFrozen is how long the orders relay is frozen before the primary dies,
	// so that rows are pending at the failover (at 40 orders/s, about twenty).
	failoverRelayFrozen = 500 * time.Millisecond
	// failoverStandbyAlone is how long only the standby is up, before it is promoted: what
	// a failover manager takes to decide.
	failoverStandbyAlone = 2 * time.Second
)

// pendingRows are the outbox rows not yet published.
const pendingRows = `
SELECT id::text FROM outbox_messages WHERE published_at IS NULL AND dead_at IS NULL ORDER BY seq`

// rowsState reads, of the rows $1, how many exist, how many are published and how many dead.
const rowsState = `
SELECT count(*), count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FILTER (WHERE dead_at IS NOT NULL)
FROM outbox_messages WHERE id = ANY($1::uuid[])`

// pendingAtKill lists, of the rows $1, those not published before $2, the kill of the old
// primary: still pending, or published since (from the new primary).
const pendingAtKill = `
SELECT id::text FROM outbox_messages
WHERE id = ANY($1::uuid[]) AND (published_at IS NULL OR published_at >= $2)`

// sessionsOf counts the sessions of an application, and those of it that LISTEN.
const sessionsOf = `
SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %'), count(*) FILTER (WHERE backend_type = 'walsender')
FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`

// failover is what pg-failover's Inject learns and its Check verifies.
type failover struct {
	// wal: the orders relay is the WAL relay, which streams from a slot instead of
	// listening, and must create its slot again on the new primary.
	wal bool
	mu  sync.Mutex
	// pending are the outbox rows pending on the new primary right after the promotion.
	pending []string
}

func pgFailoverScenario() Scenario {
	f := &failover{}
	return Scenario{
		Name: "pg-failover",
		Summary: "the orders PostgreSQL primary SIGKILLed mid-load and its synchronous standby promoted: the orders processes reconnect " +
			"through the multi-host address, every 201 survives, the rows pending at the failover are published from the new primary",
		OrdersStandby: true,
		Inject:        f.inject,
		Check:         f.check,
	}
}

// pgFailoverWALScenario is pg-failover with the orders relay on the WAL relay: its slot
// stays behind on the old primary (PostgreSQL 15), and the rows pending at the failover go
// out through the retry lane of the slot it creates on the new one.
func pgFailoverWALScenario() Scenario {
	f := &failover{wal: true}
	return Scenario{
		Name: "pg-failover-wal",
		Summary: "pg-failover with the orders WAL relay: its slot is lost with the old primary; it creates it again on the new one, " +
			"and the rows pending at the failover go out through its retry lane; every 201 survives, nothing lost",
		OrdersStandby: true,
		Inject:        f.inject,
		Check:         f.check,
		Settings:      []string{"ORDERS_RELAY_MODE=" + relayModeWAL},
	}
}

func init() { register(pgFailoverScenario()) }

func (f *failover) inject(ctx context.Context, e *Env) error {
	f.mu.Lock()
	f.pending = nil
	f.mu.Unlock()
	if len(e.Endpoints.OrdersDBServers) != 2 {
		return fmt.Errorf("the orders database has no standby (%d servers)", len(e.Endpoints.OrdersDBServers))
	}
	if !e.AtLoad(ctx, 2*time.Second) {
		return ctx.Err()
	}
	primaryURL, standbyURL := e.Endpoints.OrdersDBServers[0], e.Endpoints.OrdersDBServers[1]
	conn, err := openDB(ctx, primaryURL)
	if err != nil {
		return fmt.Errorf("connect to the primary: %w", err)
	}
	// Freeze the relay, in the middle of a claim if it can be caught in one, so that rows
	// are pending when the primary dies and its claim dies with it.
	watch := time.Now().Add(300 * time.Millisecond)
	inClaim := false
	for !inClaim && time.Now().Before(watch) {
		var n int
		if err := conn.QueryRow(ctx, inTransaction, string(OrdersRelay)).Scan(&n); err != nil {
			_ = conn.Close(ctx)
			return fmt.Errorf("read pg_stat_activity: %w", err)
		}
		inClaim = n > 0
	}
	if err := e.Target.Pause(ctx, OrdersRelay); err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("freeze %s: %w", OrdersRelay, err)
	}
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		return e.Target.Resume(context.WithoutCancel(ctx), OrdersRelay)
	}
	defer resume() //nolint:errcheck // on an early return only
	if !sleepCtx(ctx, failoverRelayFrozen) {
		_ = conn.Close(ctx)
		return ctx.Err()
	}
	rows, err := conn.Query(ctx, pendingRows)
	var before []string
	if err == nil {
		before, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("read the pending rows: %w", err)
	}

	if err := e.Target.Kill(ctx, OrdersDB); err != nil {
		return fmt.Errorf("kill the primary: %w", err)
	}
	killedAt := time.Now()
	claim := "between two claims"
	if inClaim {
		claim = "inside a claim transaction"
	}
	e.Fault(killedAt, "orders PostgreSQL primary SIGKILLed with %d outbox rows pending, the orders relay frozen %s for %s before",
		len(before), claim, failoverRelayFrozen)
	if err := resume(); err != nil {
		return fmt.Errorf("resume %s: %w", OrdersRelay, err)
	}
	cpu := e.outageStarts(ctx, "only the orders standby was up")

	// Only the standby is up: nothing may write, and the API must say so (503).
	codes := map[int]int{}
	sample := func() (get, post int) {
		get = probeStatus(ctx, http.MethodGet, e.Endpoints.OrdersURL+"/orders/"+e.Probe.ID, "", nil)
		post = probeStatus(ctx, http.MethodPost, e.Endpoints.OrdersURL+"/orders", e.Probe.Key, e.Probe.Body)
		codes[get]++
		codes[post]++
		return get, post
	}
	for time.Since(killedAt) < failoverStandbyAlone {
		sample()
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	alone := formatCodes(codes)
	if codes[http.StatusServiceUnavailable] == 0 {
		return fmt.Errorf("the API never answered 503 while only the standby was up (answers: %s)", alone)
	}
	if codes[http.StatusCreated] > 0 {
		return fmt.Errorf("the API answered 201 while only the standby was up (answers: %s)", alone)
	}
	if err := e.Target.Promote(ctx, OrdersDB); err != nil {
		return fmt.Errorf("promote the standby: %w", err)
	}
	e.outageEnds(ctx, cpu)
	promotedAt := time.Now()
	e.Healed("standby promoted (pg_ctl promote) %.1fs after the kill; API answers while only the standby was up: %s",
		promotedAt.Sub(killedAt).Seconds(), alone)

	// What the new primary has of the rows pending on the old one: all of them (the standby
	// was synchronous), and those still pending are what the relay must publish from it.
	sconn, err := openDB(ctx, standbyURL)
	if err != nil {
		return fmt.Errorf("connect to the new primary: %w", err)
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	var exist, published, dead int
	if err := sconn.QueryRow(ctx, rowsState, before).Scan(&exist, &published, &dead); err != nil {
		return fmt.Errorf("read the rows pending at the failover: %w", err)
	}
	if exist != len(before) {
		e.Fail("%d of the %d outbox rows committed on the old primary are missing on the new one", len(before)-exist, len(before))
	}
	// The rows still pending when the old primary died: those the new primary has
	// unpublished, or published after the kill (the old primary published nothing after it).
	// Not only the unpublished ones: the relay, resumed at the kill, may reach the new primary
	// and publish them all between the promotion and this query (a CI run saw it do so).
	rows, err = sconn.Query(ctx, pendingAtKill, before, killedAt)
	var still []string
	if err == nil {
		still, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("read the rows pending at the failover: %w", err)
	}
	f.mu.Lock()
	f.pending = still
	f.mu.Unlock()
	e.Saw("the new primary has %d of the %d rows pending on the old one; %d were still pending at the kill (%d published by now, %d dead)",
		exist, len(before), len(still), published, dead)
	if len(still) == 0 {
		return fmt.Errorf("no outbox row was pending at the failover: nothing shows that the new primary's relay publishes them")
	}

	// The services recover by themselves: their pools connect to the new primary.
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		get, post := sample()
		return get == http.StatusOK && post == http.StatusCreated, nil
	})
	if err != nil {
		return err
	}
	e.Saw("API answers again %.1fs after the promotion (%.1fs after the kill)", time.Since(promotedAt).Seconds(), time.Since(killedAt).Seconds())
	return nil
}

// check requires the rows pending at the failover published from the new primary, the
// orders processes connected to it (the relay listening there), and none of them restarted.
func (f *failover) check(ctx context.Context, e *Env, o *Outcome) {
	f.mu.Lock()
	pending := f.pending
	f.mu.Unlock()
	fail := func(format string, args ...any) { o.Failures = append(o.Failures, fmt.Sprintf(format, args...)) }
	if len(pending) == 0 {
		return // inject failed, and said why
	}
	conn, err := openDB(ctx, e.Endpoints.OrdersDBServers[1])
	if err != nil {
		fail("connect to the new primary: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exist, published, dead int
	if err := conn.QueryRow(ctx, rowsState, pending).Scan(&exist, &published, &dead); err != nil {
		fail("read the rows pending at the failover: %v", err)
		return
	}
	e.Saw("of the %d rows pending at the kill, %d published from the new primary, %d dead", len(pending), published, dead)
	if published != len(pending) {
		fail("%d of the %d outbox rows pending at the failover were not published from the new primary", len(pending)-published, len(pending))
	}
	checkFollowedFailover(ctx, e, conn, f.wal, fail)
}

// checkFollowedFailover fails the scenario unless the orders API and its relay have
// sessions on the new primary (conn), the relay exactly one LISTENing (or, the WAL relay,
// exactly one streaming its slot), and no process of the shop ended during the failover.
func checkFollowedFailover(ctx context.Context, e *Env, conn *pgx.Conn, wal bool, fail func(format string, args ...any)) {
	for _, svc := range []Service{OrdersAPI, OrdersRelay} {
		var n, listening, streaming int
		if err := conn.QueryRow(ctx, sessionsOf, string(svc)).Scan(&n, &listening, &streaming); err != nil {
			fail("read pg_stat_activity: %v", err)
			return
		}
		e.Saw("%s has %d sessions on the new primary (%d listening, %d streaming a slot)", svc, n, listening, streaming)
		if n == 0 {
			fail("%s has no session on the new primary", svc)
		}
		switch {
		case svc != OrdersRelay:
		case wal && streaming != 1:
			fail("%s streams its slot on the new primary with %d sessions, want 1: its stream did not follow the failover", svc, streaming)
		case !wal && listening != 1:
			fail("%s listens on the new primary with %d sessions, want 1: its LISTEN connection did not follow the failover", svc, listening)
		}
	}
	var died []string
	for _, d := range e.Target.Deaths() {
		died = append(died, fmt.Sprintf("%s (%s)", d.Service, d.Status))
	}
	if len(died) > 0 {
		fail("processes ended during the failover: %s; they must ride it out", strings.Join(died, ", "))
	}
}
