package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

// Measured is a throughput measured at one setting: N channels, writers or relays.
type Measured struct {
	N    int
	Rate float64
	// BatchedWrites (limit A): the publishing connections' sockets batch their writes
	// (batchedConn, generated from pkg/outbox/outboxrabbitmq), as the outbox publisher's do.
	BatchedWrites bool
	// CPU is what the processes taking part spent, when it was measured.
	CPU *CPUUsage
	Err error
}

// DrainMeasured is a drain by N relays with InFlight batches in flight each (1: the serial
// relay).
type DrainMeasured struct {
	N, InFlight int
	// Batch is the relays' batch size; 0 is the run's ([Results].BatchSize).
	Batch int
	// Tracing is how the relays trace.
	Tracing Tracing
	DrainResult
	Err error
}

// Results are the figures of a run, from which [Report] renders the table.
type Results struct {
	Machine Machine
	Sizes   Sizes
	Quick   bool
	Command string
	// BatchSize is the relays' batch size (pkg/outbox's default when not set).
	BatchSize int
	// InFlight is the batches in flight of the pipelined relays' drain rows.
	InFlight int
	// Started is when the run began; Took how long it ran.
	Started time.Time
	Took    time.Duration

	LimitA, LimitB []Measured
	Drain          []DrainMeasured
	Peer           *Measured
	Latency        []LatencyResult
	Scale          []ScaleResult
	Hot            *HotResult
	API            *APIResult
	Memory         *MemoryResult
	// Consume are item 9's drains in run order: limit C, then the inbox consumer.
	Consume []ConsumeResult
	// WAL is item 10: the WAL relay beside the polling relay.
	WAL *WALResult
}

// Run measures the phases of cfg, one after the other, writes progress lines to
// cfg.Progress, and writes the report (the machine, the command and the table) to out. A
// phase that fails shows its error in its rows, and the run goes on. Everything the run
// created on the servers is removed before Run returns, also when ctx is cancelled.
func Run(ctx context.Context, cfg Config, out io.Writer) (err error) {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	e := newEnv(cfg)
	defer func() {
		e.progress("cleaning up")
		if cerr := e.close(ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	res := Results{
		Sizes: cfg.Sizes, Quick: cfg.Quick, Command: cfg.Command,
		BatchSize: cmp.Or(cfg.BatchSize, 100), InFlight: cmp.Or(cfg.InFlight, DefaultInFlight), Started: time.Now(),
	}
	res.Machine = e.readMachine(ctx)
	e.progress("run %s on %s", e.id, res.Machine)
	s := cfg.Sizes

	if cfg.runs(PhaseLimits) && ctx.Err() == nil {
		res.LimitA, res.LimitB = e.limits(ctx, s)
	}
	if cfg.runs(PhaseDrain) && ctx.Err() == nil {
		e.progress("item 3: filling a backlog of %s rows", FormatCount(s.Backlog))
		_, _, ferr := e.backlog(ctx, s.Backlog) // outside the profile
		stopProfile, perr := startProfile(cfg.CPUProfile)
		if perr != nil {
			return perr
		}
		for _, v := range drainVariants(s, res.InFlight, res.BatchSize) {
			if ctx.Err() != nil {
				break
			}
			batch := cmp.Or(v.Batch, res.BatchSize)
			e.progress("item 3: %d relay(s), batch %d, %d batch(es) in flight, %s, drain %s rows", v.N, batch, v.InFlight, v.Tracing, FormatCount(s.Backlog))
			d, err := DrainResult{}, ferr
			if err == nil {
				d, err = e.drain(ctx, v.N, v.InFlight, batch, s.Backlog, v.Tracing)
			}
			v.DrainResult, v.Err = d, err
			res.Drain = append(res.Drain, v)
			e.progress("  %s", resultOrError(fmt.Sprintf("%s; per cycle: claim %s (first tenth %s, last tenth %s), publish %s, mark+commit %s; CPU per 1,000: %s",
				FormatRate(d.Rate, "rows/s"), FormatLatency(d.Claim), FormatLatency(d.FirstClaims), FormatLatency(d.LastClaims),
				FormatLatency(d.Publish), FormatLatency(d.Finish), FormatCPU(d.CPU, "relay")), err))
		}
		if err := stopProfile(); err != nil {
			return err
		}
	}
	if cfg.runs(PhasePeer) && ctx.Err() == nil {
		e.progress("item 4: Watermill's forwarder drains %s rows", FormatCount(s.PeerRows))
		rate, cpu, err := e.peer(ctx, s.PeerRows)
		res.Peer = &Measured{N: s.PeerRows, Rate: rate, CPU: cpu, Err: err}
		e.progress("  %s", resultOrError(FormatRate(rate, "rows/s")+"; CPU per 1,000: "+FormatCPU(cpu, "forwarder"), err))
	}
	if cfg.runs(PhaseLatency) && ctx.Err() == nil {
		res.Latency = e.latencies(ctx, s, res.LimitB)
	}
	if cfg.runs(PhaseScale) && ctx.Err() == nil {
		e.progress("item 6: claim and mark cost with %v published rows", s.ScaleRows)
		res.Scale = e.scale(ctx, s.ScaleRows, s.ScaleBatches)
		if ctx.Err() == nil {
			e.progress("item 6b: claim cost with %s pending rows of one aggregate, and spread", FormatCount(s.HotBacklog))
			h := e.hot(ctx, s.HotBacklog, s.ScaleBatches)
			res.Hot = &h
			e.progress("  %s", resultOrError(fmt.Sprintf("hot %s, spread %s per claim", FormatLatency(h.Hot), FormatLatency(h.Spread)), h.Err))
		}
	}
	if cfg.runs(PhaseAPI) && ctx.Err() == nil {
		e.progress("item 7: POST /orders, loadgen with %d in flight for %s", s.APIConcurrency, s.APIDuration)
		a := e.api(ctx, s.APIConcurrency, s.APIDuration)
		res.API = &a
		e.progress("  %s", resultOrError(fmt.Sprintf("%s, p50 %s, p99 %s, %d failed", FormatRate(a.Rate, "orders/s"),
			FormatLatency(a.Latency.P50), FormatLatency(a.Latency.P99), a.Failed), a.Err))
	}
	if cfg.runs(PhaseMemory) && ctx.Err() == nil {
		e.progress("item 8: peak RSS of a relay process draining %s rows", FormatCount(s.MemoryBacklog))
		m := e.memory(ctx, s.MemoryBacklog)
		res.Memory = &m
		e.progress("  %s", resultOrError(FormatMiB(m.PeakRSS), m.Err))
	}
	if cfg.runs(PhaseWAL) && ctx.Err() == nil {
		res.WAL = e.walPhase(ctx, s, WindowBatch(s, res.InFlight), res.InFlight)
	}
	if cfg.runs(PhaseConsume) && ctx.Err() == nil {
		res.Consume = e.consume(ctx, s)
	}
	res.Took = time.Since(res.Started)
	if _, werr := io.WriteString(out, Report(res)); werr != nil {
		return werr
	}
	return ctx.Err()
}

func (e *env) limits(ctx context.Context, s Sizes) (a, b []Measured) {
	top, err := e.declareTopology("limit")
	var snk *sink
	if err == nil {
		snk, err = e.startSink(top.Queue, 250*time.Millisecond)
	}
	// Each channel count with amqp091-go's own socket, which writes each publish with a
	// system call of its own, and with the writes batched as the outbox publisher's socket
	// batches them: limit A is the faster of the two.
	for _, n := range s.Channels {
		for _, batched := range []bool{false, true} {
			e.progress("limit A: %d channel(s), window %d, writes batched %t, for %s", n, s.ConfirmWindow, batched, s.LimitDuration)
			rate, cpu := 0.0, (*CPUUsage)(nil)
			if err == nil {
				rate, cpu, err = e.publishLimit(ctx, top, n, s.ConfirmWindow, batched, s.LimitDuration)
			}
			a = append(a, Measured{N: n, Rate: rate, CPU: cpu, Err: err, BatchedWrites: batched})
			e.progress("  %s", resultOrError(FormatRate(rate, "msg/s")+"; CPU per 1,000: "+FormatCPU(cpu, "publisher"), err))
		}
	}
	if snk != nil {
		snk.Close()
	}

	dbURL, err := e.createDatabase(ctx, "limitb", "")
	if err == nil {
		pool, perr := openPool(ctx, dbURL, 1)
		err = perr
		if err == nil {
			err = migrateWriter(ctx, pool)
			defer pool.Close()
		}
		for _, n := range s.Concurrency {
			e.progress("limit B: %d writer(s) for %s", n, s.LimitDuration)
			rate := 0.0
			if err == nil {
				if _, err = pool.Exec(ctx, "TRUNCATE orders, outbox_messages"); err == nil {
					rate, err = e.txLimit(ctx, dbURL, "bench.limitb", n, s.LimitDuration)
				}
			}
			b = append(b, Measured{N: n, Rate: rate, Err: err})
			e.progress("  %s", resultOrError(FormatRate(rate, "tx/s"), err))
		}
	} else {
		for _, n := range s.Concurrency {
			b = append(b, Measured{N: n, Err: err})
		}
	}
	return a, b
}

// drainVariants returns the drains of item 3 in run order: the serial relay (one batch in
// flight) with SerialRelays relays, then the pipelined relay (inFlight batches of batch
// rows) with Relays, then the pipelined relay again with as many messages in flight as limit
// A keeps unconfirmed ([WindowBatch]), when that is another batch size.
func drainVariants(s Sizes, inFlight, batch int) []DrainMeasured {
	var out []DrainMeasured
	for _, n := range s.SerialRelays {
		out = append(out, DrainMeasured{N: n, InFlight: 1})
	}
	for _, n := range s.Relays {
		out = append(out, DrainMeasured{N: n, InFlight: inFlight})
	}
	if w := WindowBatch(s, inFlight); w != batch {
		for _, n := range s.Relays {
			out = append(out, DrainMeasured{N: n, InFlight: inFlight, Batch: w})
		}
	}
	// The one pipelined relay again, tracing on the no-op provider and on the SDK: the cost
	// of tracing, against the row above.
	out = append(out, DrainMeasured{N: 1, InFlight: inFlight, Tracing: TracingNoop},
		DrainMeasured{N: 1, InFlight: inFlight, Tracing: TracingSDK})
	return out
}

// WindowBatch is the batch size at which inFlight batches keep as many messages unconfirmed
// as limit A does (its ConfirmWindow), at most pkg/outbox's largest: the relay compared with
// A at the same window.
func WindowBatch(s Sizes, inFlight int) int {
	return min(max(s.ConfirmWindow/max(inFlight, 1), 1), 10_000)
}

// CeilingRate in [Sizes].Rates stands for the writers' own ceiling: limit B with as many
// writers as the latency runs have, measured in the same run.
const CeilingRate = 0

// latencies is item 5, at each of s.Rates; [CeilingRate] is taken from limitB.
func (e *env) latencies(ctx context.Context, s Sizes, limitB []Measured) []LatencyResult {
	var out []LatencyResult
	rig, err := e.newLatencyRig(ctx)
	for _, notify := range []bool{true, false} {
		for _, asked := range s.Rates {
			if ctx.Err() != nil {
				return out
			}
			rate, rerr := asked, err
			if asked == CeilingRate {
				rate, rerr = ceilingRate(limitB)
				rerr = errors.Join(err, rerr)
			}
			e.progress("item 5: %d orders/s, %s, %s after %s warm-up", rate, wakeUp(notify), s.RateDuration, s.Warmup)
			if rerr != nil {
				out = append(out, LatencyResult{Rate: rate, Ceiling: asked == CeilingRate, Notify: notify, Err: rerr})
				continue
			}
			r := rig.run(ctx, rate, notify, TracingOff, s.Warmup, s.RateDuration, "")
			r.Ceiling = asked == CeilingRate
			out = append(out, r)
			e.progress("  confirm %s; reserved %s", resultOrError(FormatLatencies(r.Confirm), r.Err), FormatLatencies(r.Reserved))
		}
	}
	// The target rate again with the relay tracing on the no-op provider and on the SDK:
	// the cost of tracing, against the same rate tracing off above.
	for _, tracing := range []Tracing{TracingNoop, TracingSDK} {
		if ctx.Err() != nil || err != nil || !slices.Contains(s.Rates, TargetLatencyRate) {
			break
		}
		e.progress("item 5: %d orders/s, LISTEN/NOTIFY, %s", TargetLatencyRate, tracing)
		r := rig.run(ctx, TargetLatencyRate, true, tracing, s.Warmup, s.RateDuration, "")
		out = append(out, r)
		e.progress("  confirm %s; reserved %s", resultOrError(FormatLatencies(r.Confirm), r.Err), FormatLatencies(r.Reserved))
	}
	return out
}

// ceilingRate returns limit B with latencyWriters writers, rounded down to 10 orders/s.
func ceilingRate(limitB []Measured) (int, error) {
	for _, m := range limitB {
		if m.N == latencyWriters && m.Err == nil && m.Rate >= 10 {
			return int(m.Rate) / 10 * 10, nil
		}
	}
	return 0, fmt.Errorf("the writers' ceiling is limit B with %d writers, which this run did not measure (phase %s)", latencyWriters, PhaseLimits)
}

func wakeUp(notify bool) string {
	if notify {
		return "LISTEN/NOTIFY"
	}
	return "polling 100 ms"
}

func resultOrError(result string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return result
}

// startProfile starts a CPU profile into path, when set, and returns its stop.
func startProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// errorCell renders an error for a table cell, on one line and not too long.
func errorCell(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if r := []rune(msg); len(r) > 140 {
		msg = string(r[:140]) + "…"
	}
	return "error: " + msg
}
