package testinfra

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNode is a private RabbitMQ node that one test owns: its own node name, ports and
// directories, so that a test may raise a resource alarm on it or give it a configuration of
// its own without touching the broker other tests share. It needs the rabbitmq-server
// scripts of a local installation (the Debian package puts them in /usr/lib/rabbitmq/bin);
// only the machine's epmd is shared, to register the node's name.
//
// A node takes several seconds to start: share one between the subtests that need it.
type RabbitNode struct {
	// URL is the node's AMQP URL (guest/guest).
	URL string
	// Name is the node's Erlang node name (outboxtest…@localhost).
	Name string

	dir      string
	binDir   string
	tls      *tls.Config         // a client's, for a node of StartRabbitNodeTLS
	cred     *syscall.Credential // the rabbitmq user, when the tests run as root
	port     int
	distPort int
	logPath  string

	mu     sync.Mutex // guards pgid and exited, which a restart replaces
	pgid   int
	exited chan struct{}
}

// rabbitBinDirs are where the unwrapped scripts live: Debian's /usr/sbin wrappers switch
// user and reset HOME, which would give the node the shared Erlang cookie.
var rabbitBinDirs = []string{"/usr/lib/rabbitmq/bin", "/opt/rabbitmq/sbin", "/usr/local/sbin"}

// StartRabbitNode starts a private node with the given extra rabbitmq.conf lines (e.g.
// "max_message_size = 65536") and stops it when the test ends. Without a local RabbitMQ
// installation the test is skipped, or fails under CI=true.
func StartRabbitNode(t testing.TB, conf ...string) *RabbitNode {
	t.Helper()
	n, err := startRabbitNode(conf)
	if n != nil {
		t.Cleanup(n.stop)
	}
	if err != nil {
		var missing *missingError
		if errors.As(err, &missing) {
			unavailable(t, "a private RabbitMQ node", err)
		}
		t.Fatalf("private RabbitMQ node: %v", err)
	}
	return n
}

type missingError struct{ error }

func startRabbitNode(conf []string) (*RabbitNode, error) {
	n, err := newRabbitNode(conf, "")
	if err != nil {
		return n, err
	}
	if err := n.launch(); err != nil {
		return n, err
	}
	return n, n.waitReady(time.Now().Add(90 * time.Second))
}

// newRabbitNode prepares a node's ports, directories and configuration without starting it.
// A node with a cookie takes it as its Erlang cookie (the nodes of a cluster share one);
// without, it gets one of its own when it starts.
func newRabbitNode(conf []string, cookie string) (*RabbitNode, error) {
	binDir, err := rabbitBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := rootlessCredential("rabbitmq") // rabbitmq-server refuses to run as root
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	distPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-rabbit-")
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	n := &RabbitNode{
		URL:      fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
		Name:     "outboxtest" + hex.EncodeToString(suffix) + "@localhost",
		dir:      dir,
		binDir:   binDir,
		cred:     cred,
		port:     port,
		distPort: distPort,
		logPath:  filepath.Join(dir, "server.log"),
	}
	return n, n.writeFiles(conf, cookie)
}

// rabbitBinDir finds the rabbitmq-server script among rabbitBinDirs.
func rabbitBinDir() (string, error) {
	for _, d := range rabbitBinDirs {
		if st, err := os.Stat(filepath.Join(d, "rabbitmq-server")); err == nil && !st.IsDir() {
			return d, nil
		}
	}
	return "", &missingError{fmt.Errorf("rabbitmq-server not found in %v", rabbitBinDirs)}
}

// writeFiles writes the node's configuration with the extra rabbitmq.conf lines conf, makes
// its directories, owned by the node's user, and writes cookie as its Erlang cookie unless
// it is empty.
func (n *RabbitNode) writeFiles(conf []string, cookie string) error {
	if err := n.writeConfig(append([]string{fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d", n.port)}, conf...)); err != nil {
		return err
	}
	files := map[string]string{
		"enabled_plugins": "[].\n",
		// Instead of the machine's rabbitmq-env.conf, which names the shared node.
		"rabbitmq-env.conf": "ERL_EPMD_ADDRESS=127.0.0.1\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, sub := range []string{"", "mnesia", "log"} {
		p := filepath.Join(n.dir, sub)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := n.chown(p); err != nil {
			return err
		}
	}
	if cookie == "" {
		return nil
	}
	p := filepath.Join(n.dir, ".erlang.cookie")
	if err := os.WriteFile(p, []byte(cookie), 0o400); err != nil {
		return err
	}
	return n.chown(p)
}

// writeConfig writes the node's rabbitmq.conf: the lines conf (its listeners among them)
// after the testinfra's own.
func (n *RabbitNode) writeConfig(conf []string) error {
	config := fmt.Sprintf("loopback_users = none\nlog.console = true\nlog.console.level = warning\nlog.file = false\n%s\n",
		strings.Join(conf, "\n"))
	return os.WriteFile(filepath.Join(n.dir, "rabbitmq.conf"), []byte(config), 0o644)
}

// chown gives path to the node's user, when the tests run as root.
func (n *RabbitNode) chown(path string) error {
	if n.cred == nil {
		return nil
	}
	return os.Chown(path, int(n.cred.Uid), int(n.cred.Gid))
}

// rootlessCredential is the credential of the user a server runs as when the tests run as
// root, which the servers refuse: the user named name. Under any other user it is nil, and
// the server runs as the tests do.
func rootlessCredential(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, &missingError{fmt.Errorf("running as root, the %s user is needed: %w", name, err)}
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// launch starts the node's process, in the background.
func (n *RabbitNode) launch() error {
	// A node killed with SIGKILL leaves its pid file behind.
	_ = os.Remove(filepath.Join(n.dir, "pid"))
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(n.binDir, "rabbitmq-server"))
	cmd.Dir = n.dir
	cmd.Env = append(n.env(), "RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort))
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own, so that the script, the VM and its helpers stop together;
	// killed with the test binary if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: n.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	exited := make(chan struct{})
	n.mu.Lock()
	n.pgid, n.exited = cmd.Process.Pid, exited
	n.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return nil
}

// process returns the node's process group and the channel closed when its start script
// exited.
func (n *RabbitNode) process() (int, chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pgid, n.exited
}

// waitReady polls the node's AMQP port (cheaper than the CLI, which starts a VM per call)
// until it accepts a connection, the node exits, or deadline passes.
func (n *RabbitNode) waitReady(deadline time.Time) error {
	_, exited := n.process()
	for {
		select {
		case <-exited:
			return fmt.Errorf("node %s exited at start-up: %s", n.Name, n.logTail())
		default:
		}
		conn, err := amqp.DialConfig(n.URL, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second), TLSClientConfig: n.tls})
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s did not accept connections in time: %v\n%s", n.Name, err, n.logTail())
		}
		time.Sleep(200 * time.Millisecond) // polling a server that is starting up
	}
}

// env is the environment of the node and of rabbitmqctl against it: the node's name, and a
// HOME of its own, so that the Erlang cookie is private too.
func (n *RabbitNode) env() []string {
	d := func(name string) string { return filepath.Join(n.dir, name) }
	return []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"HOME=" + n.dir,
		"RABBITMQ_NODENAME=" + n.Name,
		"RABBITMQ_CONF_ENV_FILE=" + d("rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE=" + d("rabbitmq.conf"),
		"RABBITMQ_MNESIA_BASE=" + d("mnesia"),
		"RABBITMQ_LOG_BASE=" + d("log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + d("enabled_plugins"),
		"RABBITMQ_FEATURE_FLAGS_FILE=" + d("feature_flags"),
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + d("plugins-expand"),
		"RABBITMQ_PID_FILE=" + d("pid"),
	}
}

// Ctl runs rabbitmqctl against the node, e.g. Ctl(t, "set_vm_memory_high_watermark", "0").
func (n *RabbitNode) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.ctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctl runs rabbitmqctl against the node, as Ctl does, and returns its error.
func (n *RabbitNode) ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.binDir, "rabbitmqctl"), append([]string{"-n", n.Name}, args...)...)
	cmd.Dir = n.dir
	cmd.Env = n.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl -n %s %s: %w\n%s", n.Name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Addr is the node's AMQP address, "127.0.0.1:port": what the libraries' connection hooks
// report as the broker.
func (n *RabbitNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Kill SIGKILLs the node (its start script, the Erlang VM and its helpers) and returns once
// they are gone. [RabbitNode.Restart] starts it again.
func (n *RabbitNode) Kill(t testing.TB) {
	t.Helper()
	n.kill()
}

// Restart starts a killed node again on its directories, and returns once it accepts
// connections: a node of a cluster rejoins it.
func (n *RabbitNode) Restart(t testing.TB) {
	t.Helper()
	if err := n.launch(); err != nil {
		t.Fatalf("restart node %s: %v", n.Name, err)
	}
	if err := n.waitReady(time.Now().Add(90 * time.Second)); err != nil {
		t.Fatalf("restart node %s: %v", n.Name, err)
	}
}

// kill kills the node's process group and waits until none of it is left.
func (n *RabbitNode) kill() {
	pgid, exited := n.process()
	if pgid <= 0 {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
	}
	// The VM and its helpers belong to the group; wait until none is left.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(-pgid, 0) != nil {
			break
		}
	}
}

// stop kills the node and removes its directory.
func (n *RabbitNode) stop() {
	n.kill()
	_ = os.RemoveAll(n.dir)
	tlsNodes.Delete(n.URL)
}

func (n *RabbitNode) logTail() string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
