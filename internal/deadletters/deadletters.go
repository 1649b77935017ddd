// Package deadletters is the dead-letters subcommand of both services: it replays the dead
// letters of the service's dead-letter queue into the queues they were dead-lettered from,
// through pkg/inbox/inboxrabbitmq ReplayDeadLetters, with filters, a dry run and a report
// as text or JSON.
//
//	<service> dead-letters [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]
//
// --queue defaults to the service's dead-letter queue; the broker is the service's (its
// AMQP URL, the nodes of a cluster tried in turn). --type matches the AMQP type exactly,
// --version the top-level "version" field of a JSON body (the shop's events, docs/events.md:
// a body that is not a JSON object with an integer version never matches), --reason a
// substring of the dead reason; the filters combine with AND. --limit examines at most that
// many messages from the head of the queue. docs/runbook.md (RabbitMQDeadLetterQueueNotEmpty)
// says when to use it.
//
// The report has a line per group of dead letters (type, version, reason, original queue)
// and a total; with --json, stdout is one JSON object ([Report]). The exit code is that of
// the services' other commands: 0 after success (and after SIGINT or SIGTERM, which stop the
// replay between two messages), 1 after a failure, with the error on stderr (a broker is
// named by its host and port, never with its credentials), 2 after bad arguments.
package deadletters

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/internal/amqptopo"
	"github.com/outboxshop/outboxshop/internal/redact"
	"github.com/outboxshop/outboxshop/internal/service"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
)

// Name is the subcommand's name, and Usage its synopsis after the service's name.
const (
	Name  = "dead-letters"
	Usage = Name + " [--dry-run] [--type T] [--version N] [--reason TEXT] [--limit N] [--queue Q] [--json]"
)

// DialTimeout bounds the connection attempt to each broker.
const DialTimeout = 10 * time.Second

// Subcommand returns the dead-letters subcommand of the service name, whose configuration
// conf reads: its broker settings, and the dead-letter queue that --queue defaults to.
func Subcommand[C any](name string, conf func(C) (broker service.BrokerEnv, deadLetterQueue string)) service.Subcommand[C] {
	return func(ctx context.Context, cfg C, args []string, out service.Output) int {
		broker, queue := conf(cfg)
		opts, code, ok := parse(name, args, out.Stderr)
		if !ok {
			return code
		}
		opts.queue = cmp.Or(opts.queue, queue)
		log := out.Log
		if opts.json {
			// stdout holds the JSON object alone; warnings go to stderr.
			log = slog.New(slog.NewTextHandler(out.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
		var report inboxrabbitmq.ReplayReport
		tlsConf, err := broker.AMQPTLS(strings.ToUpper(name) + "_")
		if err == nil {
			report, err = run(ctx, name, broker.AMQPURLs(), tlsConf, opts, log)
		}
		if opts.json {
			if werr := writeJSON(out.Stdout, report, err); werr != nil && err == nil {
				err = fmt.Errorf("write the report: %w", werr)
			}
		} else if err == nil || report.Depth > 0 {
			writeText(out.Stdout, report)
		}
		switch {
		case err == nil:
			return 0
		case errors.Is(err, context.Canceled):
			// Asked to stop: what was replayed is in the report, the rest in place. Not a
			// success: a script (or a job that timed out) must not take it for one.
			fmt.Fprintf(out.Stderr, "%s %s: interrupted, the rest left in place: %v\n", name, Name, err)
			return 1
		default:
			fmt.Fprintf(out.Stderr, "%s %s: %v\n", name, Name, err)
			return 1
		}
	}
}

// options are the subcommand's arguments.
type options struct {
	dryRun, json bool
	typ, reason  string
	version      *int
	limit        int
	queue        string
}

// parse reads args. It returns ok false and the exit code when the subcommand must not run:
// 0 after --help, 2 after bad arguments, with the reason and the usage on stderr.
func parse(name string, args []string, stderr io.Writer) (opts options, code int, ok bool) {
	fs := flag.NewFlagSet(name+" "+Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s %s\n\n"+
			"Replays the dead letters that the filters select (all without one) into the queue each was\n"+
			"dead-lettered from; the filters combine with AND.\n\n", name, Usage)
		fs.PrintDefaults()
	}
	fs.BoolVar(&opts.dryRun, "dry-run", false, "count what would be replayed, move nothing")
	fs.StringVar(&opts.typ, "type", "", "replay only messages of AMQP type `T` (exact)")
	fs.Func("version", "replay only messages whose JSON body has the top-level integer version `N`", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("not an integer")
		}
		opts.version = &n
		return nil
	})
	fs.StringVar(&opts.reason, "reason", "", "replay only messages whose dead reason contains `TEXT`")
	fs.IntVar(&opts.limit, "limit", 0, "examine at most `N` messages from the head of the queue (0: all)")
	fs.StringVar(&opts.queue, "queue", "", "the dead-letter queue `Q` (default: the service's)")
	fs.BoolVar(&opts.json, "json", false, "print the report as one JSON object")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return opts, 0, false
		}
		return opts, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s %s: takes no arguments but flags, got %q\n", name, Name, fs.Args())
		fs.Usage()
		return opts, 2, false
	}
	if opts.limit < 0 {
		fmt.Fprintf(stderr, "%s %s: --limit must be 0 (all) or more, got %d\n", name, Name, opts.limit)
		fs.Usage()
		return opts, 2, false
	}
	return opts, 0, true
}

// match reports whether m passes every filter of o.
func (o options) match(m inboxrabbitmq.DeadLetterMessage) bool {
	if o.typ != "" && m.Type != o.typ {
		return false
	}
	if o.reason != "" && !strings.Contains(m.Reason, o.reason) {
		return false
	}
	if o.version != nil {
		v, ok := Version(m.Body)
		if !ok || v != *o.version {
			return false
		}
	}
	return true
}

// Version returns the top-level "version" field of a JSON object body, the schema version of
// the shop's events; ok is false when body is not a JSON object or has no integer version.
func Version(body []byte) (version int, ok bool) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return 0, false
	}
	raw, found := top["version"]
	if !found {
		return 0, false
	}
	n, err := strconv.Atoi(string(raw))
	if err != nil {
		return 0, false
	}
	return n, true
}

// run connects to the first broker of urls that answers and replays as opts say.
func run(ctx context.Context, name string, urls []string, tlsConf *tls.Config, opts options, log *slog.Logger) (inboxrabbitmq.ReplayReport, error) {
	empty := inboxrabbitmq.ReplayReport{Queue: opts.queue, DryRun: opts.dryRun}
	conn, err := dial(ctx, name, urls, tlsConf)
	if err != nil {
		return empty, err
	}
	defer conn.Close() //nolint:errcheck // a connection we are done with
	return inboxrabbitmq.ReplayDeadLetters(ctx, conn, inboxrabbitmq.ReplayConfig{
		Queue:  opts.queue,
		Match:  opts.match,
		DryRun: opts.dryRun,
		Limit:  opts.limit,
		GroupBy: func(m inboxrabbitmq.DeadLetterMessage) string {
			if v, ok := Version(m.Body); ok {
				return strconv.Itoa(v)
			}
			return ""
		},
		Logger: log,
	})
}

// dial connects to the brokers of urls in turn until one answers, to amqps:// ones with
// tlsConf. Its errors name each broker by host and port: never by its URL, which may hold a
// password.
func dial(ctx context.Context, name string, urls []string, tlsConf *tls.Config) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxshop " + name + " " + Name)
	var failed []string
	for i, u := range urls {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			failed = append(failed, fmt.Sprintf("broker URL %d of %d: %v", i+1, len(urls), redact.URLError(err)))
			continue
		}
		deadline := time.Now().Add(DialTimeout)
		conn, err := amqp.DialConfig(u, amqp.Config{
			Properties:      props,
			Dial:            amqptopo.DialUntil(ctx, deadline),
			TLSClientConfig: amqptopo.TLSFor(tlsConf, u),
		})
		if err == nil {
			return conn, nil
		}
		failed = append(failed, brokerName(uri)+": "+redact.Text(err.Error(), u, uri.Password))
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the broker: %w (%s)", ctx.Err(), strings.Join(failed, "; "))
		}
	}
	return nil, fmt.Errorf("connect to the broker: %s", strings.Join(failed, "; "))
}

// brokerName names a broker without its credentials: host:port, and the vhost unless it is
// the default one.
func brokerName(uri amqp.URI) string {
	name := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	if uri.Vhost != "/" {
		name += "/" + url.PathEscape(uri.Vhost)
	}
	return name
}

// Report is the JSON object of --json. Its field names are a contract: chaos scenarios parse
// them.
type Report struct {
	// Queue is the dead-letter queue, DryRun whether --dry-run was given.
	Queue  string `json:"queue"`
	DryRun bool   `json:"dry_run"`
	// Depth is how many messages the queue held at the start; Examined, Matched and
	// Replayed count the messages looked at, selected by the filters, and moved (0 in a dry
	// run); Left is Depth − Replayed.
	Depth    int `json:"depth"`
	Examined int `json:"examined"`
	Matched  int `json:"matched"`
	Replayed int `json:"replayed"`
	Left     int `json:"left"`
	// NoOriginalQueue counts the matched messages that name no queue to go back to, Failed
	// those whose copy the broker returned, to the Unroutable queues: all left in place.
	NoOriginalQueue int      `json:"no_original_queue"`
	Failed          int      `json:"failed"`
	Unroutable      []string `json:"unroutable"`
	// Groups count the examined messages by type, version, reason and original queue.
	Groups []Group `json:"groups"`
	// Error is why the command failed (exit code 1), or was interrupted; absent after success.
	Error string `json:"error,omitempty"`
}

// Group is a group of the examined dead letters in a [Report].
type Group struct {
	Type string `json:"type"`
	// Version is the body's schema version, null when it has none.
	Version *int `json:"version"`
	// Reason is the reason without its details: the consumer's ("permanent-error") or the
	// broker's ("broker: delivery_limit").
	Reason        string `json:"reason"`
	OriginalQueue string `json:"original_queue"`
	// Count is how many were examined; Matched and Replayed as in the Report.
	Count    int `json:"count"`
	Matched  int `json:"matched"`
	Replayed int `json:"replayed"`
}

// newReport is the Report of r, and of err when not nil.
func newReport(r inboxrabbitmq.ReplayReport, err error) Report {
	rep := Report{
		Queue: r.Queue, DryRun: r.DryRun, Depth: r.Depth, Examined: r.Examined, Matched: r.Matched, Replayed: r.Replayed,
		Left: r.Left, NoOriginalQueue: r.NoOriginalQueue, Failed: r.Failed,
		Unroutable: append([]string{}, r.Unroutable...), Groups: []Group{},
	}
	for _, g := range r.Groups {
		group := Group{Type: g.Type, Reason: g.Reason, OriginalQueue: g.OriginalQueue, Count: g.Examined, Matched: g.Matched,
			Replayed: g.Replayed}
		if v, err := strconv.Atoi(g.Label); err == nil {
			group.Version = &v
		}
		rep.Groups = append(rep.Groups, group)
	}
	slices.SortStableFunc(rep.Groups, func(a, b Group) int {
		return cmp.Or(strings.Compare(a.Type, b.Type), compareVersions(a.Version, b.Version),
			strings.Compare(a.Reason, b.Reason), strings.Compare(a.OriginalQueue, b.OriginalQueue))
	})
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}

// compareVersions orders no version first, then by number.
func compareVersions(a, b *int) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return cmp.Compare(*a, *b)
}

// writeJSON writes the report of r and err as one JSON object.
func writeJSON(w io.Writer, r inboxrabbitmq.ReplayReport, err error) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(newReport(r, err))
}

// writeText writes the report of r for a person: a line per group and a total.
func writeText(w io.Writer, r inboxrabbitmq.ReplayReport) {
	rep := newReport(r, nil)
	if rep.Depth == 0 {
		fmt.Fprintf(w, "no dead letters in %s\n", rep.Queue)
		return
	}
	if len(rep.Groups) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if rep.DryRun {
			fmt.Fprintln(tw, "COUNT\tMATCHED\tTYPE\tVERSION\tREASON\tORIGINAL QUEUE")
		} else {
			fmt.Fprintln(tw, "COUNT\tMATCHED\tREPLAYED\tTYPE\tVERSION\tREASON\tORIGINAL QUEUE")
		}
		for _, g := range rep.Groups {
			version := "-"
			if g.Version != nil {
				version = strconv.Itoa(*g.Version)
			}
			fields := []string{strconv.Itoa(g.Count), strconv.Itoa(g.Matched)}
			if !rep.DryRun {
				fields = append(fields, strconv.Itoa(g.Replayed))
			}
			fields = append(fields, cmp.Or(g.Type, "-"), version, cmp.Or(g.Reason, "-"), cmp.Or(g.OriginalQueue, "-"))
			fmt.Fprintln(tw, strings.Join(fields, "\t"))
		}
		_ = tw.Flush()
	}
	of := fmt.Sprintf("%d", rep.Examined)
	if rep.Examined < rep.Depth {
		of = fmt.Sprintf("the first %d of %d", rep.Examined, rep.Depth)
	}
	if rep.DryRun {
		fmt.Fprintf(w, "dry run: would replay %d of %s dead letters in %s (nothing moved)\n",
			rep.Matched-rep.NoOriginalQueue, of, rep.Queue)
	} else {
		fmt.Fprintf(w, "replayed %d of %s dead letters in %s (%d left)\n", rep.Replayed, of, rep.Queue, rep.Left)
	}
	switch rep.NoOriginalQueue {
	case 0:
	case 1:
		fmt.Fprintln(w, "1 matched dead letter names no queue to go back to: left in place")
	default:
		fmt.Fprintf(w, "%d matched dead letters name no queue to go back to: left in place\n", rep.NoOriginalQueue)
	}
}
