package testinfra

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// verboseLogs also prints what [Logs] keep, to stderr.
var verboseLogs = os.Getenv("OUTBOXSHOP_TEST_LOG") != ""

// Logs keeps every line a logger wrote, for tests that count what a loop logged while its
// server was away. It also passes each line to the test's log when OUTBOXSHOP_TEST_LOG is set.
type Logs struct {
	name    string
	mu      sync.Mutex
	records []LogRecord
}

// LogRecord is one line that [Logs] kept.
type LogRecord struct {
	Time  time.Time
	Level slog.Level
	Msg   string
	Attrs string // "key=value key=value", in order
}

// NewLogs returns a logger at debug level that writes into the returned [Logs].
func NewLogs(t testing.TB) (*slog.Logger, *Logs) {
	l := &Logs{name: t.Name()}
	return slog.New(&logsHandler{logs: l}), l
}

// Count is the number of lines at level or above whose message contains msg ("" for all).
func (l *Logs) Count(level slog.Level, msg string) int {
	n := 0
	for _, r := range l.Records() {
		if r.Level >= level && strings.Contains(r.Msg, msg) {
			n++
		}
	}
	return n
}

// Records returns a copy of the lines kept so far.
func (l *Logs) Records() []LogRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LogRecord(nil), l.records...)
}

// String lists the lines at level or above, one a line, for a failure message.
func (l *Logs) String(level slog.Level) string {
	var b strings.Builder
	for _, r := range l.Records() {
		if r.Level >= level {
			fmt.Fprintf(&b, "%s %s %q %s\n", r.Time.Format("15:04:05.000"), r.Level, r.Msg, r.Attrs)
		}
	}
	return b.String()
}

type logsHandler struct {
	logs  *Logs
	attrs []slog.Attr
	group string
}

func (h *logsHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logsHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	add := func(a slog.Attr) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%v", a.Key, a.Value)
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		if h.group != "" {
			a.Key = h.group + "." + a.Key
		}
		add(a)
		return true
	})
	rec := LogRecord{Time: r.Time, Level: r.Level, Msg: r.Message, Attrs: b.String()}
	h.logs.mu.Lock()
	h.logs.records = append(h.logs.records, rec)
	h.logs.mu.Unlock()
	if verboseLogs {
		// Not t.Logf: a loop may still log after its test ended.
		fmt.Fprintf(os.Stderr, "%s: %s %q %s\n", h.logs.name, rec.Level, rec.Msg, rec.Attrs)
	}
	return nil
}

func (h *logsHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &c
}

func (h *logsHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.group = strings.TrimPrefix(h.group+"."+name, ".")
	return &c
}
