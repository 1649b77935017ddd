// Package service is the kit both services are wired on: one lifecycle for the long-running
// parts of a process ([Group]), the loop of the periodic jobs ([Every]: every interval
// until the context ends, backing off after a failed run and logging a failure streak once),
// and the pieces of wiring that are the same in both services (the metrics registry, the
// outbox relay and its cleanup, the inbox cleanup: see wiring.go), and the command line of
// both binaries ([Command]: their subcommands, configuration, log, crash points and traces).
// A service's app package only says which components its modes run, with which settings.
//
// # Lifecycle
//
// A process is built in three steps, the same in both services:
//
//	g := service.NewGroup("orders", log)  // construct: nothing runs yet
//	g.OnStop(pool.Close)                  // resources, released after every component returned
//	g.Add("http server", serve)           // components, each a func(ctx) error
//	g.Start(ctx)                          // run them; cancelling ctx stops them too
//	err := g.Stop()                       // cancel, wait, release; the first failure
//
// The first component to fail (return an error, or return at all before it was asked to
// stop) stops the others, and [Group.Stop] and [Group.Wait] return its error. A Group never
// restarts a component: each one that depends on the database or the broker (the relay, the
// consumer, the cleanups, the stats, the periodic jobs) backs off and retries by itself
// while they are away, and logs the outage once (internal/retry). Every component
// bounds its own graceful stop (the HTTP server's and the consumer's shutdown timeouts), so
// Stop returns within the longest of them.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
)

// ErrStoppedByItself is the error of a component that returned nil before it was asked to
// stop: a part of the process is gone, so the process stops as if it had failed.
var ErrStoppedByItself = errors.New("stopped by itself")

// Group runs named components under one lifecycle. The zero value is not usable; call
// [NewGroup]. A Group starts once.
type Group struct {
	name string
	log  *slog.Logger

	mu         sync.Mutex
	components []component
	cleanups   []func()
	started    bool
	err        error

	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
}

type component struct {
	name string
	run  func(ctx context.Context) error
}

// NewGroup returns an empty group; name is the process's name in the log lines of the group
// ("orders stopped"). log nil discards.
func NewGroup(name string, log *slog.Logger) *Group {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Group{name: name, log: log, cancel: func() {}, done: make(chan struct{})}
}

// Add adds a component. run must return when its ctx is cancelled, nil after a graceful stop
// and an error when it failed. Add after Start panics.
func (g *Group) Add(name string, run func(ctx context.Context) error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		panic(fmt.Sprintf("service: component %q added to a started group", name))
	}
	g.components = append(g.components, component{name, run})
}

// OnStop registers f to run once every component has returned, or at Stop when the group
// never started (a start-up that failed half-way): closing a pool, a listener, a publisher.
// They run in the reverse order of registration.
func (g *Group) OnStop(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cleanups = append(g.cleanups, f)
}

// Start runs every component in its own goroutine and returns at once. Cancelling ctx stops
// the group, like [Group.Stop]. Start after Start, or after Stop, panics.
func (g *Group) Start(ctx context.Context) {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		panic("service: group started twice")
	}
	g.started = true
	runCtx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	components := g.components
	g.mu.Unlock()

	var wg sync.WaitGroup
	for _, c := range components {
		wg.Go(func() {
			err := c.run(runCtx)
			if err == nil && runCtx.Err() == nil {
				err = ErrStoppedByItself
			}
			if err != nil {
				g.fail(runCtx, c.name, err)
			}
		})
	}
	go func() {
		wg.Wait()
		cancel()
		g.finish()
	}()
}

// fail records the first failure and stops the other components.
func (g *Group) fail(ctx context.Context, name string, err error) {
	g.mu.Lock()
	first := g.err == nil
	if first {
		g.err = fmt.Errorf("%s: %w", name, err)
	}
	g.mu.Unlock()
	if first {
		g.log.ErrorContext(ctx, "component failed, stopping", slog.String("component", name), slog.Any("error", err))
	}
	g.cancel()
}

// finish runs the cleanups and closes done.
func (g *Group) finish() {
	g.mu.Lock()
	cleanups := slices.Clone(g.cleanups)
	g.mu.Unlock()
	for _, f := range slices.Backward(cleanups) {
		f()
	}
	g.log.Info(g.name + " stopped")
	close(g.done)
}

// Done is closed when the group has stopped: every component returned and the OnStop
// functions ran, after Stop, the cancellation of Start's ctx, or a failure.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err is the first failure, or nil (while running, and after a graceful stop).
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Wait blocks until the group has stopped and returns its first failure, or nil after a
// graceful stop. It must not be called on a group that never started.
func (g *Group) Wait() error {
	<-g.done
	return g.Err()
}

// Stop asks every component to stop, waits until they have and the OnStop functions ran,
// and returns the first failure (nil after a graceful stop). On a group that never started it
// runs the OnStop functions. It may be called more than once, and concurrently.
func (g *Group) Stop() error {
	g.mu.Lock()
	started, cancel := g.started, g.cancel
	g.started = true // no Start after Stop
	g.mu.Unlock()
	if !started {
		g.stopOnce.Do(g.finish)
	}
	cancel()
	return g.Wait()
}
