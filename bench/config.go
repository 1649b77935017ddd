package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Phases, in the order a run measures them. Each may be run alone with [Config].Phases; a
// ratio whose reference phase did not run shows as "—".
const (
	PhaseLimits  = "limits"  // A: RabbitMQ publish limit; B: order + outbox transaction limit
	PhaseDrain   = "drain"   // 3: relay drain of a backlog by 1, 2, 4 relays
	PhasePeer    = "peer"    // 4: Watermill's forwarder draining the same kind of backlog
	PhaseLatency = "latency" // 5: commit→confirm and commit→reservation at fixed rates
	PhaseScale   = "scale"   // 6: claim and mark cost with many published rows
	PhaseAPI     = "api"     // 7: POST /orders of the orders service
	PhaseMemory  = "memory"  // 8: peak RSS of a relay process while draining
	PhaseWAL     = "wal"     // 10: the WAL relay beside the polling relay, on a private server at wal_level=logical
	PhaseConsume = "consume" // C: RabbitMQ consume limit; 9: the inbox consumer draining a backlog (the longest: last)
)

// DefaultInFlight is the batches in flight of the pipelined relay's drains: pkg/outbox's
// default.
const DefaultInFlight = 2

// AllPhases lists every phase in run order.
var AllPhases = []string{PhaseLimits, PhaseDrain, PhasePeer, PhaseLatency, PhaseScale, PhaseAPI, PhaseMemory, PhaseWAL, PhaseConsume}

// Sizes are the amounts of work of a run. [FullSizes] is `make bench`; [QuickSizes] is the
// -quick run, for checking the harness on a busy machine.
type Sizes struct {
	// LimitDuration is how long each limit measurement (A and B) runs.
	LimitDuration time.Duration
	// ConfirmWindow is how many publishes limit A keeps unconfirmed at once, per channel.
	ConfirmWindow int
	// Channels are the channel counts of limit A (each on its own connection, as each
	// relay has its own); the relay drain is compared with the same count.
	Channels []int
	// Concurrency are the concurrent writers of limit B.
	Concurrency []int
	// Backlog is the number of rows the relays drain (item 3).
	Backlog int
	// Relays are the relay counts of the pipelined relay's drains; SerialRelays those of the
	// serial relay (one batch in flight), measured first, for the ratio.
	Relays, SerialRelays []int
	// PeerRows is the number of rows Watermill's forwarder drains (item 4).
	PeerRows int
	// Rates are the fixed order rates of the latency runs (orders/s); [CeilingRate] is the
	// writers' own ceiling, limit B with as many writers, measured in the same run.
	Rates []int
	// Warmup runs at the rate before the measured RateDuration.
	Warmup, RateDuration time.Duration
	// ScaleRows are the published-row counts at which the claim and mark cost is measured.
	ScaleRows []int
	// HotBacklog is the pending backlog of one aggregate whose claim cost is compared with
	// the same backlog spread over as many aggregates (item 6b).
	HotBacklog int
	// ScaleBatches is how many batches of 100 pending rows are claimed and marked per level.
	ScaleBatches int
	// APIConcurrency and APIDuration drive POST /orders (item 7).
	APIConcurrency int
	APIDuration    time.Duration
	// MemoryBacklog is the backlog the separate relay process drains (item 8).
	MemoryBacklog int
	// ConsumeBacklog is the number of messages in the quorum queue's backlog that each
	// consumer of item 9 drains: the bare consumers of limit C and the inbox consumer. The
	// queue is filled anew before every drain, outside the measured time.
	ConsumeBacklog int
	// ConsumeConcurrency are the inbox consumer's concurrencies (handlers at once, each in a
	// transaction of its own) of item 9, all with prefetch [ConsumePrefetch]: at most that.
	// Each handler of item 9 drains a backlog at each of them, with a transaction and an ack
	// per message.
	ConsumeConcurrency []int
	// ConsumeBatches are the inbox consumer's batch sizes (BatchSize: deliveries per
	// transaction) of item 9: each handler then drains a backlog in batches of each, with
	// [ConsumePrefetch] / batch transactions at once (the library's default) and multiple
	// acks every inboxrabbitmq.DefaultAckEvery. Each is above 1, at most inbox.MaxBatch and
	// divides the prefetch.
	ConsumeBatches []int
	// HotPollBound bounds the polling relay's drain of item 10's backlog of one aggregate
	// (Backlog rows), which it drains a row per cycle: its rate is what it published by then.
	HotPollBound time.Duration
	// SustainedDuration is how long item 10's sustained run writes at 80% of the WAL
	// relay's drain rate.
	SustainedDuration time.Duration
}

// FullSizes are the sizes of `make bench`: 8 to 10 minutes on 2 cores for items 3 to 8, and
// about 25 more for item 9's first eight drains of 200,000 messages (six of them by the inbox
// consumer a transaction per message, at 600 to 2,000 msg/s there), plus its six drains in
// batches.
func FullSizes() Sizes {
	return Sizes{
		LimitDuration:  5 * time.Second,
		ConfirmWindow:  1000,
		Channels:       []int{1, 2, 4},
		Concurrency:    []int{1, 8, 16, 32},
		Backlog:        200_000,
		Relays:         []int{1, 2},
		SerialRelays:   []int{1},
		PeerRows:       20_000,
		Rates:          []int{100, 300, CeilingRate}, // the floor, the target (the knee on 2 cores), the writers' ceiling
		Warmup:         2 * time.Second,
		RateDuration:   20 * time.Second,
		ScaleRows:      []int{10_000, 100_000, 1_000_000},
		ScaleBatches:   50,
		HotBacklog:     50_000,
		APIConcurrency: 16,
		APIDuration:    10 * time.Second,
		MemoryBacklog:  50_000,
		ConsumeBacklog: 200_000,
		// The warehouse's (WAREHOUSE_CONSUMER_CONCURRENCY's default), and pkg/inbox's
		// default: as many as the prefetch.
		ConsumeConcurrency: []int{8, ConsumePrefetch},
		// Four and two transactions at once.
		ConsumeBatches:    []int{8, 16},
		HotPollBound:      20 * time.Second,
		SustainedDuration: 60 * time.Second,
	}
}

// QuickSizes are the sizes of -quick: about two minutes, to check the harness.
func QuickSizes() Sizes {
	return Sizes{
		LimitDuration:  2 * time.Second,
		ConfirmWindow:  1000,
		Channels:       []int{1, 2, 4},
		Concurrency:    []int{1, 8, 16, 32},
		Backlog:        10_000,
		Relays:         []int{1, 2},
		SerialRelays:   []int{1},
		PeerRows:       5_000,
		Rates:          []int{300},
		Warmup:         time.Second,
		RateDuration:   3 * time.Second,
		ScaleRows:      []int{10_000, 100_000},
		ScaleBatches:   20,
		HotBacklog:     10_000,
		APIConcurrency: 16,
		APIDuration:    3 * time.Second,
		MemoryBacklog:  10_000,
		ConsumeBacklog: 10_000,
		// The warehouse's only: each of the inbox consumer's drains takes 7 to 20 s on a
		// 2-core machine, and a second concurrency took the run to 2 min 40 s.
		ConsumeConcurrency: []int{8},
		// The larger batch only: two transactions at once.
		ConsumeBatches:    []int{16},
		HotPollBound:      5 * time.Second,
		SustainedDuration: 5 * time.Second,
	}
}

// Config is one benchmark run.
type Config struct {
	// PostgresURL names a PostgreSQL server on which the run may create and drop databases
	// (its database is only used to do so). Every database the run creates is named
	// bench_<run id>_… and dropped at the end.
	PostgresURL string
	// AMQPURL is the RabbitMQ broker. Every exchange and queue is named bench.<run id>.… and
	// deleted at the end.
	AMQPURL string
	// Sizes of the run.
	Sizes Sizes
	// Quick marks the table as a quick run.
	Quick bool
	// Phases to run; empty runs [AllPhases].
	Phases []string
	// BatchSize of the relays (drain, latency, memory). 0 is pkg/outbox's default.
	BatchSize int
	// InFlight is the batches in flight of the pipelined relay's drains; 0 is
	// [DefaultInFlight].
	InFlight int
	// CPUProfile, when set, is the file the CPU profile of the relay drain phase goes to.
	CPUProfile string
	// RelayBinary is the relay program of the memory phase. Empty builds
	// ./bench/cmd/relay with `go build` into a temporary directory.
	RelayBinary string
	// Command is the command line printed above the table.
	Command string
	// Progress receives one line per step (stderr). nil discards.
	Progress io.Writer
	// Logger receives the logs of the libraries under test. nil discards.
	Logger *slog.Logger
}

func (c Config) validate() error {
	var errs []error
	if c.PostgresURL == "" {
		errs = append(errs, errors.New("no PostgreSQL URL"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("no AMQP URL"))
	}
	for _, p := range c.Phases {
		if !slices.Contains(AllPhases, p) {
			errs = append(errs, fmt.Errorf("unknown phase %q (want one of %s)", p, strings.Join(AllPhases, ", ")))
		}
	}
	s := c.Sizes
	if s.Backlog < 1 || s.PeerRows < 1 || s.MemoryBacklog < 1 || s.ConfirmWindow < 1 || s.ScaleBatches < 1 || s.HotBacklog < 1 ||
		s.APIConcurrency < 1 || len(s.Channels) == 0 || len(s.Concurrency) == 0 || len(s.Relays) == 0 ||
		len(s.Rates) == 0 || len(s.ScaleRows) == 0 || s.ConsumeBacklog < 1 || len(s.ConsumeConcurrency) == 0 || len(s.ConsumeBatches) == 0 ||
		s.HotPollBound <= 0 || s.SustainedDuration <= 0 {
		errs = append(errs, errors.New("every size must be positive and every list non-empty"))
	}
	for _, n := range s.ConsumeConcurrency {
		if n < 1 || n > ConsumePrefetch {
			errs = append(errs, fmt.Errorf("consumer concurrency %d out of range 1..%d (the prefetch)", n, ConsumePrefetch))
		}
	}
	for _, b := range s.ConsumeBatches {
		if b <= 1 || b > inbox.MaxBatch || ConsumePrefetch%b != 0 {
			errs = append(errs, fmt.Errorf("consumer batch %d: want 2..%d (inbox.MaxBatch) and a divisor of the prefetch, %d", b, inbox.MaxBatch, ConsumePrefetch))
		}
	}
	if c.InFlight < 0 || c.InFlight > 64 {
		errs = append(errs, fmt.Errorf("batches in flight %d out of range 0..64", c.InFlight))
	}
	if c.BatchSize < 0 || c.BatchSize > 10_000 {
		errs = append(errs, fmt.Errorf("batch size %d out of range 0..10000", c.BatchSize))
	}
	return errors.Join(errs...)
}

func (c Config) runs(phase string) bool {
	return len(c.Phases) == 0 || slices.Contains(c.Phases, phase)
}

// StderrLogger logs warnings and errors as text to stderr, for -v.
func StderrLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
