package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// rabbitServer is the local target's private RabbitMQ node: its own node name, ports, and
// directories for its database, logs and configuration, so that the machine's own broker
// (node rabbit@localhost on 5672) is never touched. Only the shared epmd (the Erlang port
// mapper) is used, to register the node's name.
type rabbitServer struct {
	node     string
	dir      string
	port     int
	distPort int
	acct     *account
	script   string

	// tls, when set, are the certificates of a node that takes AMQP over TLS alone.
	tls *testinfra.TLSFiles
	// ns and ip, when set, are the network namespace the node runs in and its address there
	// (a node of a cluster on a network lab); otherwise it listens on 127.0.0.1 and
	// registers with the machine's epmd. conf is more of rabbitmq.conf.
	ns, ip string
	conf   string

	proc *groupProcess // nil when not started or stopped
	// watermark is the node's memory high watermark before memoryAlarm raised the alarm.
	watermark string
}

// rabbitScripts are the server start scripts, the unwrapped one first: Debian's
// /usr/sbin/rabbitmq-server wrapper sends the output of a node run as the rabbitmq user to
// the shared /var/log/rabbitmq/startup_log.
var rabbitScripts = []string{"/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server", "/opt/rabbitmq/sbin/rabbitmq-server"}

func findRabbitScript() (string, error) {
	for _, p := range rabbitScripts {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("rabbitmq-server not found on PATH nor in %v", rabbitScripts)
}

func newRabbitServer(node, dir string) (*rabbitServer, error) {
	script, err := findRabbitScript()
	if err != nil {
		return nil, err
	}
	acct, err := runAs("rabbitmq")
	if err != nil {
		return nil, err
	}
	port, err := testinfra.FreePort()
	if err != nil {
		return nil, err
	}
	distPort, err := testinfra.FreePort()
	if err != nil {
		return nil, err
	}
	return &rabbitServer{node: node, dir: dir, port: port, distPort: distPort, acct: acct, script: script}, nil
}

// URL is the broker's AMQP URL (user guest, allowed from anywhere by loopback_users = none:
// through the proxy, connections still come from 127.0.0.1, but nothing here depends on it).
//
// Over TLS, it names the host of the node's certificate, and the CA and the client
// certificate as URL parameters, for the runner's own clients (amqp091-go reads them).
func (s *rabbitServer) URL() string {
	if s.tls != nil {
		return s.serviceURL() + "?cacertfile=" + url.QueryEscape(s.tls.CAFile) +
			"&certfile=" + url.QueryEscape(s.tls.ClientCertFile) + "&keyfile=" + url.QueryEscape(s.tls.ClientKeyFile)
	}
	return fmt.Sprintf("amqp://guest:guest@%s/", s.addr())
}

// serviceURL is the URL a service gets: URL, but over TLS without the files, which the
// services take from their settings (*_AMQP_CA_FILE and the others) and refuse in the URL.
func (s *rabbitServer) serviceURL() string {
	if s.tls != nil {
		return fmt.Sprintf("amqps://guest:guest@%s:%d/", testinfra.TLSHost, s.port)
	}
	return s.URL()
}

func (s *rabbitServer) addr() string { return net.JoinHostPort(s.host(), strconv.Itoa(s.port)) }

// host is the address the node listens on.
func (s *rabbitServer) host() string {
	if s.ip != "" {
		return s.ip
	}
	return "127.0.0.1"
}

// init writes the node's configuration and directories.
func (s *rabbitServer) init() error {
	for _, d := range []string{s.dir, filepath.Join(s.dir, "mnesia"), filepath.Join(s.dir, "log")} {
		if err := s.acct.mkdirOwned(d); err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
	}
	listeners := fmt.Sprintf("listeners.tcp.1 = %s\n", s.addr())
	if s.tls != nil {
		// AMQP over TLS alone, and a client certificate of the CA required of every client.
		if err := copyOwned(s.acct, s.dir, map[string]string{
			"ca.pem": s.tls.CAFile, "server.pem": s.tls.ServerCertFile, "server.key": s.tls.ServerKeyFile,
		}); err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
		d := func(name string) string { return filepath.Join(s.dir, name) }
		listeners = fmt.Sprintf("listeners.tcp = none\nlisteners.ssl.1 = 127.0.0.1:%d\n", s.port) +
			"ssl_options.cacertfile = " + d("ca.pem") + "\n" +
			"ssl_options.certfile = " + d("server.pem") + "\n" +
			"ssl_options.keyfile = " + d("server.key") + "\n" +
			"ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
	}
	files := map[string]string{
		"enabled_plugins": "[].\n",
		"rabbitmq.conf": listeners + "loopback_users = none\n" +
			"log.console = true\nlog.console.level = warning\nlog.file = false\n" + s.conf,
	}
	if s.ns != "" {
		// The machine's rabbitmq-env.conf may bind epmd and the distribution to 127.0.0.1
		// (Debian's does): in a namespace of its own, the node must be reachable on its
		// address, and so must its epmd, which it starts there.
		files["rabbitmq-env.conf"] = "# the node's own: not the machine's\n"
	}
	for name, content := range files {
		p := filepath.Join(s.dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
		if err := s.acct.chown(p); err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
	}
	return nil
}

// env is the environment of the node and of the command-line tools that talk to it: its
// name, its directories and, through HOME, its private Erlang cookie.
func (s *rabbitServer) env() []string {
	d := func(name string) string { return filepath.Join(s.dir, name) }
	env := []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"HOME=" + s.dir, // a private Erlang cookie; the shared one is left alone
		"RABBITMQ_NODENAME=" + s.node,
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(s.distPort),
		"RABBITMQ_CONFIG_FILE=" + d("rabbitmq.conf"),
		"RABBITMQ_MNESIA_BASE=" + d("mnesia"),
		"RABBITMQ_LOG_BASE=" + d("log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + d("enabled_plugins"),
		"RABBITMQ_FEATURE_FLAGS_FILE=" + d("feature_flags"),
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + d("plugins-expand"),
		"RABBITMQ_PID_FILE=" + d("pid"),
	}
	if s.ns != "" {
		env = append(env, "RABBITMQ_CONF_ENV_FILE="+d("rabbitmq-env.conf"))
	}
	return env
}

// logPath is where the node's output goes.
func (s *rabbitServer) logPath() string { return filepath.Join(s.dir, "log", "server.log") }

// start starts the node in the foreground of its own process group and returns once it
// accepts AMQP connections. Started again on the same directories after a kill, it recovers
// its durable queues and their persistent messages.
func (s *rabbitServer) start(ctx context.Context) error {
	logPath := s.logPath()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := command(s.ns, s.acct, s.script)
	cmd.Dir = s.dir
	cmd.Env = s.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := startGroupProcess(cmd)
	if err != nil {
		return fmt.Errorf("rabbitmq: start %s: %w", s.script, err)
	}
	s.proc = proc

	// A cluster node started again after a SIGKILL recovers its quorum queues' logs and
	// waits for its peers' tables: on a loaded two-core machine that has taken over 90 s.
	ctx, cancel := context.WithTimeout(ctx, 150*time.Second)
	defer cancel()
	return s.waitAMQP(ctx)
}

// waitAMQP waits until the node accepts an AMQP connection: after its start, or after a
// join_cluster restarted its application. A node whose process exits meanwhile fails it at
// once.
func (s *rabbitServer) waitAMQP(ctx context.Context) error {
	err := poll(ctx, 250*time.Millisecond, func() (bool, error) {
		if s.proc != nil {
			select {
			case <-s.proc.exited:
				return false, errors.New("the node exited")
			default:
			}
		}
		if !tcpAnswers(s.addr()) {
			return false, nil
		}
		conn, err := amqp.DialConfig(s.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: wait for node %s: %w: %s", s.node, err, tail(s.logPath(), 20))
	}
	return nil
}

// kill SIGKILLs the node (the start script, erl and beam.smp, and their helpers) and returns
// once it is gone and its port is closed.
func (s *rabbitServer) kill(ctx context.Context) error {
	if s.proc == nil {
		return nil
	}
	// The start script runs erl (which becomes beam.smp) as a background job of the same
	// process group, so one signal to the group reaches the VM and its helpers.
	if err := signalGroup(s.proc.pid, syscall.SIGKILL); err != nil {
		return err
	}
	if err := s.proc.waitGone(ctx); err != nil {
		return fmt.Errorf("rabbitmq %w", err)
	}
	if err := poll(ctx, 50*time.Millisecond, func() (bool, error) { return !tcpAnswers(s.addr()), nil }); err != nil {
		return fmt.Errorf("rabbitmq port still open after the kill: %w", err)
	}
	s.proc = nil
	return nil
}

// running reports whether the node's process is up.
func (s *rabbitServer) running() bool { return s.proc.running() }

// tail returns the last n lines of the file at path, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctl runs rabbitmqctl against the node, as the node's user and with the node's environment
// (the unwrapped script: Debian's /usr/sbin wrapper switches user and resets HOME, and with
// it the cookie), and returns its standard output.
func (s *rabbitServer) ctl(ctx context.Context, args ...string) (string, error) {
	bin := filepath.Join(filepath.Dir(s.script), "rabbitmqctl")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = lookBin("rabbitmqctl", "/usr/lib/rabbitmq/bin"); err != nil {
			return "", err
		}
	}
	// In the node's namespace: the tool finds the node, and the node's peers, by the names
	// its hosts file gives them.
	cmd := commandContext(ctx, s.ns, s.acct, bin, append([]string{"-q", "-n", s.node}, args...)...)
	cmd.Dir = s.dir
	cmd.Env = s.env()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// The Erlang expressions memoryAlarm evaluates on the node.
const (
	evalWatermark = "vm_memory_monitor:get_vm_memory_high_watermark()."
	evalAlarms    = "rabbit_alarm:get_alarms()."
)

// readWatermark reads and keeps the node's memory high watermark, which memoryAlarm sets
// back when it clears the alarm. Each rabbitmqctl call starts an Erlang VM (seconds on a
// busy machine), so it is read once, while the target prepares.
func (s *rabbitServer) readWatermark(ctx context.Context) error {
	wm, err := s.ctl(ctx, "eval", evalWatermark)
	if err != nil {
		return err
	}
	if _, err := watermarkArgs(wm); err != nil {
		return err
	}
	s.watermark = wm
	return nil
}

// memoryAlarm raises the node's memory alarm (on: `rabbitmqctl set_vm_memory_high_watermark
// 0`) or clears it (the watermark read by readWatermark set back). The alarm is in effect,
// or gone, when it returns; describe then asks the node for its alarms, as evidence.
func (s *rabbitServer) memoryAlarm(ctx context.Context, on bool) error {
	if s.watermark == "" {
		if err := s.readWatermark(ctx); err != nil {
			return err
		}
	}
	args := []string{"0"}
	if !on {
		var err error
		if args, err = watermarkArgs(s.watermark); err != nil {
			return err
		}
	}
	_, err := s.ctl(ctx, append([]string{"set_vm_memory_high_watermark"}, args...)...)
	return err
}

// alarms lists the node's alarms as it reports them ("[{{resource_limit,memory,node},[]}]").
func (s *rabbitServer) alarms(ctx context.Context) (string, error) {
	return s.ctl(ctx, "eval", evalAlarms)
}

// watermarkArgs turns the node's watermark, as evalWatermark prints it ("0.4",
// "{absolute,1073741824}"), into the arguments of set_vm_memory_high_watermark.
func watermarkArgs(wm string) ([]string, error) {
	wm = strings.TrimSpace(wm)
	if rest, ok := strings.CutPrefix(wm, "{absolute,"); ok {
		n := strings.TrimSuffix(rest, "}")
		if _, err := strconv.ParseInt(n, 10, 64); err != nil {
			return nil, fmt.Errorf("rabbitmq: unreadable watermark %q", wm)
		}
		return []string{"absolute", n}, nil
	}
	if _, err := strconv.ParseFloat(wm, 64); err != nil {
		return nil, fmt.Errorf("rabbitmq: unreadable watermark %q (was the alarm raised?)", wm)
	}
	return []string{wm}, nil
}
