package observe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Install is what to do when Prometheus or Alertmanager is missing.
const Install = "install them with: sudo apt-get install prometheus prometheus-alertmanager (Debian, Ubuntu), " +
	"or put prometheus and alertmanager from https://prometheus.io/download/ on the PATH"

// stopSystemServices stops what Debian's packages start on the ports make observe uses.
const stopSystemServices = "sudo systemctl disable --now prometheus prometheus-alertmanager"

// Binaries are the servers' executables.
type Binaries struct {
	Prometheus, Alertmanager string
}

// FindBinaries looks Prometheus and Alertmanager up on the PATH. Debian names Alertmanager
// prometheus-alertmanager, the release archives alertmanager.
func FindBinaries() (Binaries, error) {
	var b Binaries
	var missing []string
	var err error
	if b.Prometheus, err = exec.LookPath("prometheus"); err != nil {
		missing = append(missing, "prometheus")
	}
	for _, name := range []string{"alertmanager", "prometheus-alertmanager"} {
		if b.Alertmanager, err = exec.LookPath(name); err == nil {
			break
		}
	}
	if b.Alertmanager == "" {
		missing = append(missing, "alertmanager")
	}
	if len(missing) > 0 {
		return Binaries{}, fmt.Errorf("%s not found on the PATH; %s", strings.Join(missing, " and "), Install)
	}
	return b, nil
}

// Config is what Run runs.
type Config struct {
	Options
	// AlertLog is the executable of tools/cmd/alertlog, the webhook receiver that prints the
	// notifications. Empty: none runs, and Alertmanager's notifications fail (its UI still
	// shows the alerts).
	AlertLog string
	// Out receives the URLs to open and the notifications; os.Stdout when nil.
	Out io.Writer
	// StopTimeout is how long a server may take to stop before it is killed; 10 s when zero.
	StopTimeout time.Duration
}

// server is a child process: its name, command line and log file.
type server struct {
	name  string
	path  string
	args  []string
	ready string // URL answering 200 once it serves
	log   string // file its output goes to; empty: Out
}

// prometheusServer is Prometheus on the generated configuration, with its data in the
// scratch folder, the flags of the compose file (exemplars stored, 7 days kept), and its
// external URL on localhost so that the links in the alerts it sends open here.
func prometheusServer(path string, o Options, t table) server {
	listen := t.local(composePrometheus)
	return server{
		name: "prometheus", path: path,
		args: []string{
			"--config.file=" + filepath.Join(o.Dir, PrometheusConfig),
			"--storage.tsdb.path=" + filepath.Join(o.Dir, "prometheus", "data"),
			"--storage.tsdb.retention.time=7d",
			"--web.listen-address=" + listen,
			"--web.external-url=" + browserURL(listen),
			"--enable-feature=exemplar-storage",
		},
		ready: "http://" + listen + "/-/ready",
		log:   filepath.Join(o.Dir, "prometheus.log"),
	}
}

// alertmanagerServer is Alertmanager on the generated configuration, alone (no cluster port
// to bind), with its silences and notification log in the scratch folder.
func alertmanagerServer(path string, o Options, t table) server {
	listen := t.local(composeAlertmanager)
	return server{
		name: "alertmanager", path: path,
		args: []string{
			"--config.file=" + filepath.Join(o.Dir, AlertmanagerConfig),
			"--storage.path=" + filepath.Join(o.Dir, "alertmanager", "data"),
			"--web.listen-address=" + listen,
			"--web.external-url=" + browserURL(listen),
			"--cluster.listen-address=",
		},
		ready: "http://" + listen + "/-/ready",
		log:   filepath.Join(o.Dir, "alertmanager.log"),
	}
}

// alertLogServer is the webhook receiver on the address Alertmanager's receivers post to.
func alertLogServer(path string, t table) server {
	listen := t.local(composeAlertLogger)
	return server{name: "alert logger", path: path, args: nil, ready: "http://" + listen + "/healthz"}
}

// checkFree fails when an address the servers are to listen on is taken. Otherwise a server
// that cannot bind would fail only after the one already there had answered its readiness
// check.
func checkFree(t table) error {
	for _, compose := range []string{composePrometheus, composeAlertmanager, composeAlertLogger} {
		addr := t.local(compose)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s is in use (%w): is make observe running already, or Prometheus or Alertmanager as a system service (%s)?",
				addr, err, stopSystemServices)
		}
		ln.Close()
	}
	return nil
}

// process is a started server.
type process struct {
	server
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited; err is then set
	err  error
}

func start(s server, out io.Writer, env []string) (*process, error) {
	cmd := exec.Command(s.path, s.args...)
	cmd.Env = env
	w := out
	if s.log != "" {
		f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		// The child has its own descriptor once started: ours is closed at once.
		defer f.Close()
		w = f
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	p := &process{server: s, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls the server's ready URL until it answers 200. It fails when the server exits
// first (a port in use, a configuration it refuses: its log says which) or when ctx ends.
func (p *process) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.ready, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v)%s", p.name, p.err, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w", p.name, p.ready, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// logTail is the end of the server's log file, to show why it failed.
func (p *process) logTail() string {
	if p.log == "" {
		return ""
	}
	raw, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	lines = lines[max(0, len(lines)-5):]
	tail := "; the end of " + p.log + ":\n  " + strings.Join(lines, "\n  ")
	if strings.Contains(tail, "address already in use") {
		// Debian's packages start system services on the same ports.
		tail += "\n  Is it running as a system service? " + stopSystemServices
	}
	return tail
}

// stop asks the server to stop (SIGTERM: each of them shuts down gracefully on it) and kills
// it after timeout.
func (p *process) stop(timeout time.Duration) error {
	select {
	case <-p.done:
		// It exited by itself: Run reports that.
		return nil
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s did not stop within %s: killed", p.name, timeout)
		}
	}
	// Stopped by our signal, or by the terminal's Ctrl-C that reached it too: not an error;
	// a failure on the way out is.
	var exit *exec.ExitError
	if errors.As(p.err, &exit) && exit.Exited() && exit.ExitCode() != 0 {
		return fmt.Errorf("%s: %w", p.name, p.err)
	}
	return nil
}

// Run generates the configuration (Generate), starts Prometheus, Alertmanager and the alert
// logger, prints the URLs to open, and runs until ctx ends (Ctrl-C) or one of them exits;
// then it stops the others. It returns nil after a stop by ctx.
func Run(ctx context.Context, cfg Config) (err error) {
	out := cmp.Or[io.Writer](cfg.Out, os.Stdout)
	timeout := cmp.Or(cfg.StopTimeout, 10*time.Second)
	bins, err := FindBinaries()
	if err != nil {
		return err
	}
	if err := Generate(cfg.Options); err != nil {
		return err
	}
	t := cfg.table()
	if err := checkFree(t); err != nil {
		return err
	}
	servers := []server{
		prometheusServer(bins.Prometheus, cfg.Options, t),
		alertmanagerServer(bins.Alertmanager, cfg.Options, t),
	}
	if cfg.AlertLog != "" {
		servers = append(servers, alertLogServer(cfg.AlertLog, t))
	}
	env := append(os.Environ(), "ALERTLOG_HTTP_ADDR="+t.local(composeAlertLogger))

	var procs []*process
	defer func() {
		// The last started first: Prometheus stops sending to Alertmanager before it goes.
		for i := len(procs) - 1; i >= 0; i-- {
			err = errors.Join(err, procs[i].stop(timeout))
		}
	}()
	for _, s := range servers {
		p, err := start(s, out, env)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, p := range procs {
		if err := p.waitReady(readyCtx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	printTour(out, cfg, t)

	exited := make(chan *process, len(procs))
	for _, p := range procs {
		go func() {
			<-p.done
			exited <- p
		}()
	}
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "observe: stopping")
		return nil
	case p := <-exited:
		// A Ctrl-C reaches the servers too (one process group), and one of them may be done
		// before this process has seen the signal: give the signal a moment to arrive.
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "observe: stopping")
			return nil
		case <-time.After(time.Second):
		}
		return fmt.Errorf("%s exited (%v)%s", p.name, p.err, p.logTail())
	}
}

// BacklogQuery is the outbox backlog of each service, as the API processes read it.
const BacklogQuery = "max by (job) (outbox_pending_messages)"

// graphURL opens expr as a graph of the last 15 minutes in Prometheus's own UI (the classic
// one of the Debian package and the current one read the same parameters).
func graphURL(prom, expr string) string {
	return prom + "/graph?g0.expr=" + strings.ReplaceAll(url.QueryEscape(expr), "+", "%20") + "&g0.tab=0&g0.range_input=15m"
}

// printTour says where to look, and which of the shop's targets do not answer yet.
func printTour(out io.Writer, cfg Config, t table) {
	prom, am := browserURL(t.local(composePrometheus)), browserURL(t.local(composeAlertmanager))
	backlog := graphURL(prom, BacklogQuery)
	fmt.Fprintf(out, `
Prometheus     %s          targets %s/targets, alerts %s/alerts
Alertmanager   %s
Outbox backlog %s
Configuration  %s (layout %s), logs %s/*.log
`, prom, prom, prom, am, backlog, filepath.Join(cfg.Dir, PrometheusConfig), t.layout, cfg.Dir)
	if cfg.AlertLog != "" {
		fmt.Fprintf(out, "Notifications  printed below as JSON lines (the alert logger on %s)\n", t.local(composeAlertLogger))
	}

	var down []string
	var shopDown, rabbitDown bool
	seen := map[string]bool{}
	for _, a := range cfg.addresses() {
		host, _, _ := strings.Cut(a.Compose, ":")
		local := a.Local(t.layout)
		if seen[local] || a.Compose == composePrometheus || a.Compose == composeAlertmanager || a.Compose == composeAlertLogger {
			continue
		}
		seen[local] = true
		conn, err := net.DialTimeout("tcp", local, 300*time.Millisecond)
		if err == nil {
			conn.Close()
			continue
		}
		down = append(down, local+" ("+host+")")
		if host == "rabbitmq" {
			rabbitDown = true
		} else {
			shopDown = true
		}
	}
	if len(down) > 0 {
		fmt.Fprintf(out, "\nNot answering yet: %s.\n", strings.Join(down, ", "))
	}
	switch {
	case shopDown && t.layout == LayoutAll:
		fmt.Fprintln(out, "  Start the shop with make run in another terminal (OBSERVE_LAYOUT=roles: one process per role).")
	case shopDown:
		fmt.Fprintln(out, "  Start the shop's four processes (docs/local.md, \"One process per role\").")
	}
	if rabbitDown {
		fmt.Fprintln(out, "  RabbitMQ serves metrics once its plugin is on: sudo rabbitmq-plugins enable rabbitmq_prometheus.")
		fmt.Fprintln(out, "  Until then TargetDown fires for the jobs rabbitmq and rabbitmq-detailed.")
	}
	fmt.Fprintln(out, "\nCtrl-C stops Prometheus and Alertmanager; their data stays in "+cfg.Dir+".")
}
