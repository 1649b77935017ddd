package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// pgDirs are where Debian and the PostgreSQL images keep the server binaries.
var pgDirs = []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin", "/usr/local/pgsql/bin"}

// pgServer is a private PostgreSQL server of the local target: its own data directory, port
// and socket directory, started and killed by the runner.
type pgServer struct {
	name    string
	dir     string // owned by the postgres user; holds data/, the socket and the log
	port    int
	acct    *account
	initdb  string
	binary  string
	logPath string
	// args are extra command-line settings of the server ("-c", "name=value").
	args []string
	// tls, when set, are the certificates of a server that takes TLS alone (useTLS).
	tls *testinfra.TLSFiles
	// ns and ip, when set, are the network namespace the server runs in and its address
	// there (onLab); otherwise it listens on 127.0.0.1 beside the runner.
	ns, ip string

	proc *groupProcess // nil when not started or stopped
}

func newPGServer(name, dir string) (*pgServer, error) {
	initdb, err := lookBin("initdb", pgDirs...)
	if err != nil {
		return nil, err
	}
	binary, err := lookBin("postgres", filepath.Dir(initdb))
	if err != nil {
		return nil, err
	}
	acct, err := runAs("postgres")
	if err != nil {
		return nil, err
	}
	port, err := testinfra.FreePort()
	if err != nil {
		return nil, err
	}
	return &pgServer{
		name: name, dir: dir, port: port, acct: acct, initdb: initdb, binary: binary,
		logPath: filepath.Join(dir, "postgres.log"),
	}, nil
}

// URL is the URL of database db on this server, for the runner's own clients: over TLS,
// with the CA and the client certificate as URL parameters, when the server takes TLS alone.
func (s *pgServer) URL(db string) string {
	if s.tls != nil {
		return s.serviceURL(db) + s.tls.TLSFileParams()
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.addr(), db)
}

// serviceURL is the URL of database db that a service gets: URL, but over TLS without the
// files, which the services take from their settings (*_DATABASE_CA_FILE and the others)
// and refuse in the URL. The host is the one the server's certificate names.
func (s *pgServer) serviceURL(db string) string {
	if s.tls != nil {
		return fmt.Sprintf("postgres://postgres@%s:%d/%s?sslmode=verify-full", testinfra.TLSHost, s.port, db)
	}
	return s.URL(db)
}

// useTLS makes the server, once initialised (init or clone), take connections over TLS
// alone, with the server certificate of files, and authenticate them by a client
// certificate of their CA whose common name is the user's (cert). The socket keeps trust,
// for the tools. It takes effect at the next start.
func (s *pgServer) useTLS(files *testinfra.TLSFiles) error {
	data := filepath.Join(s.dir, "data")
	hba := "local all all trust\n" +
		"hostssl all all 127.0.0.1/32 cert\nhostssl all all ::1/128 cert\n" +
		"hostssl replication all 127.0.0.1/32 cert\nhostssl replication all ::1/128 cert\n"
	if err := writeOwned(s.acct, filepath.Join(data, "pg_hba.conf"), []byte(hba)); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	// PostgreSQL refuses a key that others can read: each file is the server's user's alone.
	if err := copyOwned(s.acct, data, map[string]string{
		"ca.pem": files.CAFile, "server.pem": files.ServerCertFile, "server.key": files.ServerKeyFile,
	}); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	s.args = append(s.args, "-c", "ssl=on", "-c", "ssl_ca_file=ca.pem", "-c", "ssl_cert_file=server.pem", "-c", "ssl_key_file=server.key")
	s.tls = files
	return nil
}

func (s *pgServer) addr() string { return net.JoinHostPort(s.host(), strconv.Itoa(s.port)) }

// host is the address the server listens on.
func (s *pgServer) host() string {
	if s.ip != "" {
		return s.ip
	}
	return "127.0.0.1"
}

// onLab makes the server, once initialised (init or clone), run in the lab host h's network
// namespace on h's address, and take connections (replication included) from the lab's
// network, where the runner and the other hosts are. It takes effect at the next start.
func (s *pgServer) onLab(h *netHost, subnet string) error {
	hba := filepath.Join(s.dir, "data", "pg_hba.conf")
	f, err := os.OpenFile(hba, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	_, err = fmt.Fprintf(f, "host all all %[1]s trust\nhost replication all %[1]s trust\n", subnet)
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	s.ns, s.ip = h.NS, h.IP
	return nil
}

// init creates the cluster.
func (s *pgServer) init(ctx context.Context) error {
	if err := s.acct.mkdirOwned(s.dir); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	cmd := exec.CommandContext(ctx, s.initdb, "-D", filepath.Join(s.dir, "data"), "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
	cmd.Dir = s.dir
	cmd.SysProcAttr = groupAttr(s.acct)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: initdb: %w\n%s", s.name, err, out)
	}
	return nil
}

// start starts the server and returns once it accepts queries.
//
// fsync is off: the runner kills processes, never the machine, and what a killed server had
// written is in the kernel's page cache, so a crash loses nothing; the shared CI machine is
// spared the disk flushes.
func (s *pgServer) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=" + s.host(), "-c", "fsync=off", "-c", "max_connections=200",
		"-c", "shared_buffers=32MB", "-c", "log_min_messages=warning",
		// So that a scenario can run the services on their WAL relays.
		"-c", "wal_level=logical"}, s.args...)
	cmd := command(s.ns, s.acct, s.binary, args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C"}
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := startGroupProcess(cmd)
	if err != nil {
		return fmt.Errorf("%s: start postgres: %w", s.name, err)
	}
	s.proc = proc

	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case <-proc.exited:
			return false, fmt.Errorf("%s: postgres exited at start-up; see %s:\n%s", s.name, s.logPath, s.logTail())
		default:
		}
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			return false, nil
		}
		defer conn.Close(ctx)
		return conn.Ping(ctx) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s: wait for postgres: %w", s.name, err)
	}
	return nil
}

// kill SIGKILLs the postmaster and all its backends at once, as a crash would, and returns
// once they are gone. Killing only the postmaster would leave backends holding its shared
// memory, and the next start would refuse to run ("pre-existing shared memory block is
// still in use"). The backends are the postmaster's children, each in a process group of
// its own: the signal to the postmaster's group does not reach them, so each gets its own.
func (s *pgServer) kill(ctx context.Context) error {
	if s.proc == nil {
		return nil
	}
	backends := testinfra.ChildProcesses(s.proc.pid)
	if err := signalGroup(s.proc.pid, syscall.SIGKILL); err != nil {
		return err
	}
	for _, pid := range backends {
		_ = syscall.Kill(pid, syscall.SIGKILL) // one that exited already is not an error
	}
	if err := s.waitGone(ctx); err != nil {
		return err
	}
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		return !slices.ContainsFunc(backends, func(pid int) bool { return !testinfra.ProcessGone(pid) }), nil
	})
	if err != nil {
		return fmt.Errorf("%s: backends of the killed postmaster did not exit: %w", s.name, err)
	}
	return nil
}

// stop shuts the server down fast (SIGINT: active sessions are ended), then kills it if it
// takes too long.
func (s *pgServer) stop(ctx context.Context) error {
	if s.proc == nil {
		return nil
	}
	_ = signalGroup(s.proc.pid, syscall.SIGINT)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.waitGone(sctx); err == nil {
		return nil
	}
	return s.kill(ctx)
}

func (s *pgServer) waitGone(ctx context.Context) error {
	if err := s.proc.waitGone(ctx); err != nil {
		return fmt.Errorf("%s: postgres %w", s.name, err)
	}
	s.proc = nil
	return nil
}

// running reports whether the server process is up.
func (s *pgServer) running() bool { return s.proc.running() }

// dropDatabase drops db, ending its sessions.
func (s *pgServer) dropDatabase(ctx context.Context, db string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("%s: drop database %s: %w", s.name, db, err)
	}
	return nil
}

// logTail is the end of the server's log, for an error.
func (s *pgServer) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}
