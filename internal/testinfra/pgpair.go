package testinfra

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresBinDirs are where Debian and the PostgreSQL images keep the server binaries.
var postgresBinDirs = []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin", "/usr/local/pgsql/bin"}

// standbyName is the standby's application_name, which the primary's
// synchronous_standby_names waits for.
const standbyName = "standby"

// PostgresPair is a private PostgreSQL primary with a synchronous streaming standby, for
// tests of a failover: each server has its own data directory, port and socket directory,
// and both are removed when the test ends. A commit on the primary returns once the standby
// has it (synchronous_commit=on, synchronous_standby_names naming the standby), so what a
// client saw committed survives the primary's loss.
//
// The usual failover is [PostgresPair.KillPrimary] then [PostgresPair.Promote]; clients given
// [PostgresPair.URL], which lists both servers with target_session_attrs=read-write, follow
// it. It needs the PostgreSQL server binaries (initdb, postgres, pg_basebackup, pg_ctl) of a
// local installation; as root, the servers run as the postgres user. A pair takes a few
// seconds to start: share one between the subtests that need it.
type PostgresPair struct {
	// Primary is the server that takes writes at the start; Standby streams from it.
	Primary, Standby *PostgresServer

	binDir string
	dir    string
	cred   *syscall.Credential
}

// PostgresServer is one server of a [PostgresPair].
type PostgresServer struct {
	// Port is the server's port on 127.0.0.1.
	Port int

	name    string
	data    string
	pair    *PostgresPair
	pgid    int
	exited  chan struct{}
	logPath string
	args    []string // the start's extra arguments, for a restart
}

// StartPostgresPair initialises a primary, starts it, clones the standby from it with
// pg_basebackup -R, starts the standby and waits until the primary reports it as its
// synchronous standby. Without the server binaries the test is skipped, or fails under
// CI=true.
func StartPostgresPair(t testing.TB) *PostgresPair {
	t.Helper()
	return startPair(t)
}

// StartLogicalPostgresPair is [StartPostgresPair] with both servers at wal_level=logical, for
// tests that read the primary's changes through a logical replication slot. On PostgreSQL 15
// the standby has no slot of its own: once promoted, it decodes for new slots only.
func StartLogicalPostgresPair(t testing.TB) *PostgresPair {
	t.Helper()
	return startPair(t, "-c", "wal_level=logical")
}

func startPair(t testing.TB, settings ...string) *PostgresPair {
	t.Helper()
	p, err := startPostgresPair(settings...)
	if p != nil {
		t.Cleanup(p.stop)
	}
	if err != nil {
		var missing *missingError
		if errors.As(err, &missing) {
			unavailable(t, "a private PostgreSQL pair", err)
		}
		t.Fatalf("private PostgreSQL pair: %v", err)
	}
	return p
}

// startPostgresPair makes the pair: its directories, the primary, the standby cloned from
// it, and the wait until the standby is synchronous. It returns the pair as far as it got,
// for its cleanup, with the error that stopped it.
func startPostgresPair(settings ...string) (*PostgresPair, error) {
	binDir, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := rootlessCredential("postgres") // initdb and postgres refuse to run as root
	if err != nil {
		return nil, err
	}
	p, err := newPostgresPair(binDir, cred)
	if err != nil {
		return p, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.startServers(ctx, settings...); err != nil {
		return p, err
	}
	return p, p.waitSynchronous(ctx)
}

// postgresBinDir finds the server binaries among postgresBinDirs.
func postgresBinDir() (string, error) {
	for _, d := range postgresBinDirs {
		if st, err := os.Stat(filepath.Join(d, "pg_basebackup")); err == nil && !st.IsDir() {
			return d, nil
		}
	}
	return "", &missingError{fmt.Errorf("pg_basebackup not found in %v", postgresBinDirs)}
}

// newPostgresPair lays out the pair's directory: a data directory and a port for each
// server, and the socket directory. It returns the pair once its directory exists, so that
// a failure after that still removes it.
func newPostgresPair(binDir string, cred *syscall.Credential) (*PostgresPair, error) {
	dir, err := os.MkdirTemp("", "outbox-pgpair-")
	if err != nil {
		return nil, err
	}
	p := &PostgresPair{binDir: binDir, dir: dir, cred: cred}
	// The servers run as the postgres user and must reach their directories.
	if err := os.Chmod(dir, 0o755); err != nil {
		return p, err
	}
	for _, name := range []string{"primary", standbyName} {
		port, err := FreePort()
		if err != nil {
			return p, err
		}
		s := &PostgresServer{
			Port: port, name: name, data: filepath.Join(dir, name), pair: p,
			logPath: filepath.Join(dir, name+".log"),
		}
		if err := p.mkdir(s.data, 0o700); err != nil {
			return p, err
		}
		if name == "primary" {
			p.Primary = s
		} else {
			p.Standby = s
		}
	}
	return p, p.mkdir(filepath.Join(dir, "sockets"), 0o755)
}

// startServers initialises the primary and starts it, clones the standby from it with
// pg_basebackup -R, and starts the standby, each server with the extra settings given.
func (p *PostgresPair) startServers(ctx context.Context, settings ...string) error {
	if out, err := p.run(ctx, "initdb", "-D", p.Primary.data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// Only the primary's command line names the synchronous standby: once promoted, the
	// standby has none to wait for, and its commits return at once.
	if err := p.Primary.start(ctx, append([]string{"-c", "synchronous_standby_names=FIRST 1 (" + standbyName + ")"}, settings...)...); err != nil {
		return err
	}
	if out, err := p.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Primary.Port),
		"-U", "postgres", "-D", p.Standby.data, "-R", "-X", "stream", "--no-sync"); err != nil {
		return fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	return p.Standby.start(ctx, settings...)
}

// waitSynchronous waits until the primary streams to the standby synchronously: before
// that, commits would wait for it anyway, but a test must not start with a standby still
// catching up.
func (p *PostgresPair) waitSynchronous(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.Primary.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the primary: %w", err)
	}
	defer conn.Close(ctx)
	for {
		var state string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standbyName).Scan(&state)
		if err == nil && state == "sync" {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the standby never became synchronous (%v): %s", err, p.Standby.logTail())
		}
		time.Sleep(50 * time.Millisecond) // polling a server that is starting to stream
	}
}

// mkdir creates a directory the servers' user owns.
func (p *PostgresPair) mkdir(path string, mode os.FileMode) error {
	if err := os.MkdirAll(path, mode); err != nil {
		return err
	}
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	return p.own(path)
}

// own gives path to the servers' user, when the tests run as root.
func (p *PostgresPair) own(path string) error {
	if p.cred != nil {
		return os.Chown(path, int(p.cred.Uid), int(p.cred.Gid))
	}
	return nil
}

// run runs one of the PostgreSQL programs as the servers' user.
func (p *PostgresPair) run(ctx context.Context, program string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, program), args...)
	cmd.Dir = p.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "PGSSLMODE=disable"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	return cmd.CombinedOutput()
}

// URL is the multi-host URL of database db: both servers, with
// target_session_attrs=read-write, so that a connection always lands on the server that
// takes writes, whichever that is now.
func (p *PostgresPair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		p.Primary.Port, p.Standby.Port, url.PathEscape(db))
}

// CreateDatabase creates database db on the primary (the standby gets it through
// replication) and returns its multi-host URL.
func (p *PostgresPair) CreateDatabase(t testing.TB, db string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.Primary.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatalf("create database %s: %v", db, err)
	}
	p.WaitReplayed(t)
	return p.URL(db)
}

// WaitReplayed returns once the standby has applied all it has received. A synchronous
// commit returns when the standby has the commit on disk, not when a query there sees it
// (synchronous_commit=on, not remote_apply: a failover needs only the first); a test that
// reads the standby while it is still a standby calls this first, with the primary alive or
// dead. The promotion itself replays all that was received before taking writes.
func (p *PostgresPair) WaitReplayed(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.Standby.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the standby: %v", err)
	}
	defer conn.Close(ctx)
	for {
		var caughtUp bool
		err := conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()`).Scan(&caughtUp)
		if err == nil && caughtUp {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the standby did not replay what it received (%v): %s", err, p.Standby.logTail())
		}
		time.Sleep(20 * time.Millisecond) // polling the standby's startup process
	}
}

// KillPrimary SIGKILLs the primary, postmaster and backends at once, as a crash would, and
// returns once they are gone. The standby stays a standby until [PostgresPair.Promote]:
// meanwhile nothing accepts writes.
func (p *PostgresPair) KillPrimary(t testing.TB) {
	t.Helper()
	if err := p.Primary.kill(); err != nil {
		t.Fatalf("kill the primary: %v", err)
	}
}

// KillStandby SIGKILLs the standby and returns once it is gone. A primary that names it as
// its synchronous standby then takes commits without returning them: each waits until the
// standby is back ([PostgresPair.StartStandby]) or its client gives up, and one whose wait
// is cancelled stays committed on the primary alone.
func (p *PostgresPair) KillStandby(t testing.TB) {
	t.Helper()
	if err := p.Standby.kill(); err != nil {
		t.Fatalf("kill the standby: %v", err)
	}
}

// StartStandby starts the standby again after [PostgresPair.KillStandby]; it resumes
// streaming from the primary if the primary is up. It returns once the standby accepts
// (read-only) connections, not once it has caught up.
func (p *PostgresPair) StartStandby(t testing.TB) {
	t.Helper()
	if err := p.Standby.restart(); err != nil {
		t.Fatalf("start the standby: %v", err)
	}
}

// RestartPrimary SIGKILLs the primary and starts it again, as a crash and a supervisor's
// restart would: crash recovery replays its WAL, so what it committed locally, replicated or
// not, is visible again. It returns once the primary accepts connections.
func (p *PostgresPair) RestartPrimary(t testing.TB) {
	t.Helper()
	p.KillPrimary(t)
	if err := p.Primary.restart(); err != nil {
		t.Fatalf("restart the primary: %v", err)
	}
}

// restart starts a killed server again with the arguments of its first start. A
// postmaster that finds the old shared memory block still in use refuses to start (the
// kernel may take a moment to release it after the last process attached to it died): it is
// tried again.
func (s *PostgresServer) restart() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		err := s.start(ctx, s.args...)
		if err == nil || !strings.Contains(err.Error(), "pre-existing shared memory block") || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // until the old backends have exited
	}
}

// Promote makes the standby a primary (pg_ctl promote, waiting until it accepts writes).
func (p *PostgresPair) Promote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := p.run(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", p.Standby.data); err != nil {
		t.Fatalf("pg_ctl promote: %v\n%s", err, out)
	}
}

// URL is the URL of database db on this server alone.
func (s *PostgresServer) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, url.PathEscape(db))
}

// start starts the server and returns once it accepts connections. fsync is off: the tests
// kill processes, never the machine, and what a killed server wrote is in the page cache.
func (s *PostgresServer) start(ctx context.Context, extra ...string) error {
	p := s.pair
	s.args = extra
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"-D", s.data, "-p", strconv.Itoa(s.Port), "-k", filepath.Join(p.dir, "sockets"),
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=100",
		"-c", "shared_buffers=16MB", "-c", "cluster_name=" + s.name, "-c", "log_min_messages=warning"}, extra...)
	cmd := exec.Command(filepath.Join(p.binDir, "postgres"), args...)
	cmd.Dir = p.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C"}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own, so that the postmaster and its backends die together;
	// killed with the test binary if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.pgid = cmd.Process.Pid
	s.exited = make(chan struct{})
	exited := s.exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited at start-up: %s", s.name, s.logTail())
		default:
		}
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s did not accept connections: %v\n%s", s.name, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond) // polling a server that is starting up
	}
}

// kill SIGKILLs the server, its postmaster and every process the postmaster started, as a
// crash of its machine would, and returns once none of them runs. Each child of the
// postmaster (backend, walsender, walreceiver, …) runs in a session of its own (PostgreSQL
// calls setsid), which a signal to the postmaster's process group does not reach; left
// alone, a walreceiver or a backend goes on for a moment after its postmaster died: long
// enough for a standby to acknowledge a synchronous commit, or for a primary's backend to
// commit and replicate one. So the postmaster is stopped first, that it start no process
// while its children are listed, and then all are killed.
func (s *PostgresServer) kill() error {
	if s.pgid == 0 {
		return nil
	}
	_ = syscall.Kill(s.pgid, syscall.SIGSTOP)
	children := ChildProcesses(s.pgid)
	_ = syscall.Kill(-s.pgid, syscall.SIGKILL)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s: postmaster still running 30s after SIGKILL", s.name)
	}
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(-s.pgid, 0) == nil || anyRunning(children); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: processes still running 30s after SIGKILL", s.name)
		}
	}
	s.pgid = 0
	return nil
}

// anyRunning reports whether one of pids has not exited (a zombie has).
func anyRunning(pids []int) bool {
	return slices.ContainsFunc(pids, func(pid int) bool { return !ProcessGone(pid) })
}

// stop kills both servers and removes their directories.
func (p *PostgresPair) stop() {
	for _, s := range []*PostgresServer{p.Primary, p.Standby} {
		if s != nil {
			_ = s.kill()
		}
	}
	_ = os.RemoveAll(p.dir)
}

func (s *PostgresServer) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// StartServer starts a private PostgreSQL server alone, with the settings given after the
// testinfra's own (["-c", "wal_level=logical"], say: a later setting wins), for a program
// rather than a test: the bench measures the WAL relay on one, leaving the shared server as
// it is. The server is [PostgresPair]'s primary without a standby; it dies with the program.
// stop kills it and removes its directory; it is to be called also when err is not nil.
func StartServer(settings ...string) (s *PostgresServer, stop func(), err error) {
	return startServer(nil, settings...)
}

// startServer is StartServer with a step between initdb and the start: prepare may write
// files into the new data directory, and returns settings that go before the caller's.
func startServer(prepare func(s *PostgresServer) ([]string, error), settings ...string) (s *PostgresServer, stop func(), err error) {
	binDir, err := postgresBinDir()
	if err != nil {
		return nil, func() {}, err
	}
	cred, err := rootlessCredential("postgres")
	if err != nil {
		return nil, func() {}, err
	}
	p, err := newPostgresPair(binDir, cred)
	if p == nil {
		return nil, func() {}, err
	}
	p.Standby = nil // never started: stop skips it
	if err != nil {
		return nil, p.stop, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := p.run(ctx, "initdb", "-D", p.Primary.data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return nil, p.stop, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if prepare != nil {
		first, err := prepare(p.Primary)
		if err != nil {
			return nil, p.stop, err
		}
		settings = append(first, settings...)
	}
	if err := p.Primary.start(ctx, settings...); err != nil {
		return nil, p.stop, err
	}
	return p.Primary, p.stop, nil
}
