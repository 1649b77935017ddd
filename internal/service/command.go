package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/outboxshop/outboxshop/internal/failpoint"
	"github.com/outboxshop/outboxshop/internal/logging"
	"github.com/outboxshop/outboxshop/internal/telemetry"
)

// Command is the command line of a service's binary, the same in both services: each app
// package returns its Command, and cmd/<service>/main.go is
//
//	func main() { os.Exit(app.Command().Main()) }
//
// The subcommands both services have:
//
//	api, serve   the HTTP API and the consumer (the app in mode "api")
//	relay        the outbox relay, with /healthz, /readyz and /metrics ("relay")
//	all          everything in one process ("all")
//	migrate      create and migrate the database, then exit
//	help         print Usage
//
// and the service's own (Commands: the warehouse's seed). Run reads the configuration once
// from the environment (Load), sets up the log from it (internal/logging: JSON or text lines
// on stdout), and, for the three modes, arms the crash points of CHAOS_FAILPOINTS
// (internal/failpoint) and the export of traces the OTEL_* variables ask for
// (internal/telemetry) before it runs the app until its ctx ends.
//
// The exit code is 0 after success or a graceful stop (SIGINT, SIGTERM), 1 after a failure
// (a configuration error on stderr, any other in the log as "<name> failed"), 2 after a
// usage error (on stderr, with Usage).
type Command[C any] struct {
	// Name is the service's name ("orders"): the binary's, the prefix of its messages on
	// stderr, the service of its log lines and of its traces.
	Name string
	// Usage is the help text: on stdout for help, on stderr after a usage error.
	Usage string
	// Load reads the configuration from environ (an unset or empty variable keeps its
	// default) and validates it.
	Load func(environ map[string]string) (C, error)
	// Settings are what Run needs of a configuration besides the app's own settings.
	Settings func(cfg C) Settings
	// New returns the app of cfg in mode ("api", "relay" or "all"), which Run runs until
	// ctx ends or a component fails.
	New func(cfg C, mode string, opts Options) (Runner, error)
	// Migrate is the migrate subcommand.
	Migrate func(ctx context.Context, cfg C, log *slog.Logger) error
	// Commands are the service's own subcommands, by name.
	Commands map[string]Subcommand[C]
}

// Settings are the parts of a service's configuration that its [Command] needs.
type Settings struct {
	// LogFormat (json or text) and LogLevel (debug, info, warn or error) set up the log.
	LogFormat, LogLevel string
	// ShutdownTimeout bounds the export of the last spans once the app has stopped.
	ShutdownTimeout time.Duration
}

// Runner is a service's app: Run starts it and returns once it has stopped (nil after a
// graceful stop, when ctx ends).
type Runner interface {
	Run(ctx context.Context) error
}

// Subcommand runs one of a service's own subcommands with the arguments after its name, and
// returns the exit code: 0, 1, or 2 for bad arguments. out.Exit turns an error into the code
// the service's other commands exit with.
type Subcommand[C any] func(ctx context.Context, cfg C, args []string, out Output) int

// Output is where a subcommand writes: its results on Stdout, a refusal meant for the
// operator on Stderr, everything else to Log.
type Output struct {
	Stdout, Stderr io.Writer
	Log            *slog.Logger

	name, command string
}

// Exit returns the exit code of a command that returned err: 0 for nil, and for a
// cancellation (the process was asked to stop: a graceful stop, also while the database was
// still awaited); else 1, after logging err as "<name> failed".
func (o Output) Exit(ctx context.Context, err error) int {
	if err == nil || errors.Is(err, context.Canceled) {
		return 0
	}
	o.Log.ErrorContext(ctx, o.name+" failed", slog.String("command", o.command), slog.Any("error", err))
	return 1
}

// modes are the subcommands that run the app, and the mode each runs it in.
var modes = map[string]string{"api": "api", "serve": "api", "relay": "relay", "all": "all"}

// helps are the spellings of help.
var helps = []string{"help", "-h", "-help", "--help"}

// Main runs the command line of the process (os.Args, the environment, os.Stdout and
// os.Stderr) until it is done or SIGINT or SIGTERM stops it gracefully, and returns the exit
// code for os.Exit.
func (c Command[C]) Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.Run(ctx, os.Args[1:], env.ToMap(os.Environ()), os.Stdout, os.Stderr)
}

// Run runs the command of args (the arguments after the binary's name) with the
// configuration in environ, until it is done or ctx ends, and returns the exit code (see
// [Command]). Tests call it with their own environment and buffers.
func (c Command[C]) Run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, c.Usage)
		return 2
	}
	name, args := args[0], args[1:]
	mode, runsApp := modes[name]
	own, isOwn := c.Commands[name]
	switch {
	case slices.Contains(helps, name):
		fmt.Fprint(stdout, c.Usage)
		return 0
	case !runsApp && !isOwn && name != "migrate":
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", c.Name, name, c.Usage)
		return 2
	case !isOwn && len(args) > 0:
		fmt.Fprintf(stderr, "%s %s: takes no arguments, got %q\n\n%s", c.Name, name, args, c.Usage)
		return 2
	}
	cfg, err := c.Load(environ)
	if err != nil {
		fmt.Fprintln(stderr, c.Name+":", err)
		return 1
	}
	s := c.Settings(cfg)
	log, err := logging.New(stdout, s.LogFormat, s.LogLevel, c.Name)
	if err != nil {
		fmt.Fprintln(stderr, c.Name+":", err)
		return 1
	}
	out := Output{Stdout: stdout, Stderr: stderr, Log: log, name: c.Name, command: name}
	switch {
	case isOwn:
		return own(ctx, cfg, args, out)
	case name == "migrate":
		return out.Exit(ctx, c.Migrate(ctx, cfg, log))
	default:
		return out.Exit(ctx, c.serve(ctx, cfg, mode, environ, s, log))
	}
}

// serve runs the app of cfg in mode until ctx ends or a component fails.
func (c Command[C]) serve(ctx context.Context, cfg C, mode string, environ map[string]string, s Settings, log *slog.Logger) error {
	fp, err := failpoint.Parse(environ[failpoint.EnvVar])
	if err != nil {
		return fmt.Errorf("%s: %w", failpoint.EnvVar, err)
	}
	tel, err := telemetry.FromEnv(ctx, environ, c.Name)
	if err != nil {
		return err
	}
	// After the app stopped: the spans of its last requests and messages are sent within the
	// shutdown timeout.
	defer tel.Close(s.ShutdownTimeout, log)
	app, err := c.New(cfg, mode, Options{
		Logger: log, Failpoints: fp, TracerProvider: tel.TracerProvider(), Propagator: tel.Propagator(),
	})
	if err != nil {
		return err
	}
	return app.Run(ctx)
}
