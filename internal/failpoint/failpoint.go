// Package failpoint implements named crash points armed from the environment.
//
// CHAOS_FAILPOINTS holds a comma-separated list of name=action entries, for example
//
//	CHAOS_FAILPOINTS=relay.after-publish=kill@25,consumer.after-commit=kill
//
// kill@N sends the process SIGKILL the N-th time the point is reached (kill means kill@1):
// no deferred code runs, no connection is closed politely — as when a machine dies. panic@N
// panics there instead ("failpoint <name>"): in an HTTP handler the recoverer answers 500,
// anywhere else the process crashes with Go's stack trace, for tests of what a panic shows.
// A point that is not armed costs one map lookup on a nil map; a nil *Set costs a nil check.
package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// EnvVar is the environment variable read by FromEnv.
const EnvVar = "CHAOS_FAILPOINTS"

// Set is a set of armed points. The zero value and nil arm nothing.
type Set struct {
	points map[string]*point
	kill   func() // replaced in tests
}

type point struct {
	action string // "kill" or "panic"
	at     int64
	hits   atomic.Int64
}

// FromEnv parses CHAOS_FAILPOINTS. An empty variable gives a nil Set.
func FromEnv() (*Set, error) { return Parse(os.Getenv(EnvVar)) }

// Parse parses a spec such as "relay.after-publish=kill@25,api.after-commit=kill" (or
// "api.after-commit=panic").
func Parse(spec string) (*Set, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	s := &Set{points: map[string]*point{}, kill: killSelf}
	for _, entry := range strings.Split(spec, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("failpoint %q: want name=kill, name=kill@N, name=panic or name=panic@N", entry)
		}
		verb, count, hasCount := strings.Cut(action, "@")
		if verb != "kill" && verb != "panic" {
			return nil, fmt.Errorf("failpoint %q: unknown action %q (kill or panic)", entry, verb)
		}
		at := int64(1)
		if hasCount {
			n, err := strconv.ParseInt(count, 10, 64)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("failpoint %q: %s@N needs a positive N", entry, verb)
			}
			at = n
		}
		s.points[name] = &point{action: verb, at: at}
	}
	return s, nil
}

// Hit records that the point was reached and acts if it is armed for this hit.
func (s *Set) Hit(name string) {
	if s == nil {
		return
	}
	p, ok := s.points[name]
	if !ok {
		return
	}
	if p.hits.Add(1) != p.at {
		return
	}
	if p.action == "panic" {
		panic("failpoint " + name)
	}
	s.kill()
}

// Armed lists the armed point names, for a start-up log line.
func (s *Set) Armed() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.points))
	for n, p := range s.points {
		names = append(names, fmt.Sprintf("%s=%s@%d", n, p.action, p.at))
	}
	return names
}

// Hook returns a Failpoint hook of pkg/outbox or pkg/inbox/inboxrabbitmq that hits s at the
// point its event names (name reads it from the event), or nil when s is nil, so that the
// library skips the call:
//
//	Failpoint: failpoint.Hook(fp, func(h outbox.FailpointHit) string { return h.Name })
func Hook[E any](s *Set, name func(E) string) func(E) {
	if s == nil {
		return nil
	}
	return func(e E) { s.Hit(name(e)) }
}

func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never return into the code the point guards
}
