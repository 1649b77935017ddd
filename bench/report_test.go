package bench_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/bench"
)

// results is a complete run with round figures: every target but the latency ones and two
// relays' share of A is met.
func results() bench.Results {
	return bench.Results{
		Sizes:     bench.FullSizes(),
		BatchSize: 100,
		InFlight:  2,
		Command:   "go run ./bench/cmd/bench",
		LimitA: []bench.Measured{{N: 1, Rate: 10_000, CPU: &bench.CPUUsage{Messages: 50_000, Elapsed: 5 * time.Second, Process: time.Second,
			Postgres: -1, Broker: 5 * time.Second, Idle: 0.4}}, {N: 1, Rate: 9_000, BatchedWrites: true},
			{N: 2, Rate: 16_000}, {N: 2, Rate: 15_000, BatchedWrites: true}},
		LimitB: []bench.Measured{{N: 16, Rate: 4_000}},
		Drain: []bench.DrainMeasured{
			{N: 1, InFlight: 1, DrainResult: bench.DrainResult{Rate: 4_000, Cycles: 2000, Claim: time.Millisecond, Publish: 12 * time.Millisecond, Finish: 2 * time.Millisecond,
				FirstClaims: 900 * time.Microsecond, LastClaims: 1100 * time.Microsecond}},
			{N: 1, InFlight: 2, DrainResult: bench.DrainResult{Rate: 8_500, Cycles: 2000, Claim: 5 * time.Millisecond,
				CPU: &bench.CPUUsage{Messages: 200_000, Elapsed: 40 * time.Second, Process: 10 * time.Second, Postgres: 10 * time.Second, Broker: 30 * time.Second, Idle: 0.05}}},
			{N: 2, InFlight: 2, DrainResult: bench.DrainResult{Rate: 12_000}},
			{N: 1, InFlight: 2, Batch: 500, DrainResult: bench.DrainResult{Rate: 9_000,
				CPU: &bench.CPUUsage{Messages: 200_000, Elapsed: 22 * time.Second, Process: 6 * time.Second, Postgres: 8 * time.Second, Broker: 26 * time.Second, Idle: 0.1}}},
			{N: 2, InFlight: 2, Batch: 500, Err: errors.New("relay down")},
			{N: 1, InFlight: 2, Tracing: bench.TracingNoop, DrainResult: bench.DrainResult{Rate: 8_415}},
			{N: 1, InFlight: 2, Tracing: bench.TracingSDK, DrainResult: bench.DrainResult{Rate: 8_330}},
		},
		Peer: &bench.Measured{N: 20_000, Rate: 1000},
		Latency: []bench.LatencyResult{
			{Rate: 300, Notify: true, Achieved: 299.6,
				Confirm:  bench.Latencies{N: 6_000, P50: 3 * time.Millisecond, P99: 12 * time.Millisecond, P999: 20 * time.Millisecond},
				Handled:  bench.Latencies{N: 6_000, P50: 5 * time.Millisecond, P99: 15 * time.Millisecond},
				Reserved: bench.Latencies{N: 6_000, P50: 8 * time.Millisecond, P99: 25 * time.Millisecond, P999: 40 * time.Millisecond}},
			{Rate: 3_990, Ceiling: true, Notify: true, Achieved: 2_000,
				Confirm:  bench.Latencies{N: 40_000, P50: 30 * time.Millisecond, P99: 120 * time.Millisecond, P999: 200 * time.Millisecond},
				Reserved: bench.Latencies{N: 40_000, P50: 3 * time.Second, P99: 5 * time.Second, P999: 5 * time.Second}},
			{Rate: 300, Notify: false, Err: errors.New("boom\nsecond line")},
			{Rate: 300, Notify: true, Tracing: bench.TracingNoop, Achieved: 299.7,
				Confirm:  bench.Latencies{N: 6_000, P50: 3 * time.Millisecond, P99: 11 * time.Millisecond, P999: 21 * time.Millisecond},
				Reserved: bench.Latencies{N: 6_000, P50: 8 * time.Millisecond, P99: 24 * time.Millisecond, P999: 41 * time.Millisecond}},
			{Rate: 300, Notify: true, Tracing: bench.TracingSDK, Achieved: 299.8,
				Confirm:  bench.Latencies{N: 6_000, P50: 3 * time.Millisecond, P99: 13 * time.Millisecond, P999: 21 * time.Millisecond},
				Reserved: bench.Latencies{N: 6_000, P50: 8 * time.Millisecond, P99: 26 * time.Millisecond, P999: 41 * time.Millisecond}},
		},
		Scale: []bench.ScaleResult{
			{Published: 10_000, Claim: 20 * time.Microsecond, Mark: 30 * time.Microsecond},
			{Published: 1_000_000, Claim: 22 * time.Microsecond, Mark: 31 * time.Microsecond},
		},
		API:    &bench.APIResult{Concurrency: 16, Rate: 2_000, Latency: bench.Latencies{N: 100, P50: 7 * time.Millisecond, P99: 20 * time.Millisecond}},
		Memory: &bench.MemoryResult{Rows: 200_000, PeakRSS: 30 << 20, Rate: 6_000},
	}
}

// rows returns the rows whose What contains what.
func rows(tab bench.Table, what string) []bench.Row {
	var out []bench.Row
	for _, r := range tab.Rows {
		if strings.Contains(r.What, what) {
			out = append(out, r)
		}
	}
	return out
}

// row returns the first row whose What contains what.
func row(t *testing.T, tab bench.Table, what string) bench.Row {
	t.Helper()
	for _, r := range tab.Rows {
		if strings.Contains(r.What, what) {
			return r
		}
	}
	t.Fatalf("no row %q in\n%s", what, tab.Markdown())
	return bench.Row{}
}

func TestBuildTable(t *testing.T) {
	t.Parallel()

	t.Run("LimitAIsTheFasterSocket", func(t *testing.T) {
		t.Parallel()
		r := results()
		r.LimitA[1].Rate = 12_500 // one channel, writes batched: now the faster
		tab := bench.BuildTable(r)
		require.Len(t, rows(tab, "RabbitMQ publish"), 4, "both sockets of both channel counts")
		require.Equal(t, "12,500 msg/s", row(t, tab, "1 channel, writes batched (the publisher's socket)").Result)
		one := row(t, tab, "1 relay, batch 100, pipelined (2 batches in flight)")
		require.Equal(t, "68% of A (1 ch) · 2.13× serial", one.Ratio, "against the faster of the two")
		require.Equal(t, "✗ ≥ 80% of A", one.Target)
		require.Equal(t, "75% of A (2 ch)", row(t, tab, "2 relays").Ratio, "two channels: amqp091-go's own socket was faster")
	})

	t.Run("RatiosAgainstTheSameRun", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(results())
		serial := row(t, tab, "1 relay, batch 100, serial (1 batch in flight)")
		require.Equal(t, "4,000 rows/s", serial.Result)
		require.Equal(t, "40% of A (1 ch)", serial.Ratio)
		require.Empty(t, serial.Target, "the serial relay is there for the ratio")
		one := row(t, tab, "1 relay, batch 100, pipelined (2 batches in flight)")
		require.Equal(t, "8,500 rows/s", one.Result)
		require.Equal(t, "85% of A (1 ch) · 2.13× serial · A's CPU per msg 48% of this row's", one.Ratio,
			"A: 120 ms per 1,000 msgs (publisher + broker), the row 250 (relay + pg + broker)")
		require.Equal(t, "✓ ≥ 80% of A", one.Target)
		require.Equal(t, "relay 50.0 ms · pg 50.0 ms · broker 150 ms · idle 5%", one.CPU)
		wide := row(t, tab, "1 relay, batch 500, pipelined (2 batches in flight): 1,000 in flight, as limit A")
		require.Equal(t, "9,000 rows/s", wide.Result)
		require.Equal(t, "90% of A (1 ch) · A's CPU per msg 60% of this row's", wide.Ratio, "no serial run of batch 500 to compare with")
		require.Equal(t, "✓ ≥ 80% of A", wide.Target)
		wideTwo := row(t, tab, "2 relays, batch 500")
		require.Contains(t, wideTwo.Result, "relay down")
		require.Equal(t, "? ≥ 90% of A (not measured)", wideTwo.Target)
		two := row(t, tab, "2 relays, batch 100")
		require.Equal(t, "75% of A (2 ch)", two.Ratio, "compared with limit A on as many channels; no serial run of two")
		require.Equal(t, "✗ ≥ 90% of A", two.Target)
		require.Equal(t, "—", two.CPU, "not measured")
		for _, c := range []struct{ mode, drain, ratio string }{
			{"tracing on the no-op provider", "8,415 rows/s", "99% of tracing off"},
			{"tracing on (SDK", "8,330 rows/s", "98% of tracing off"},
		} {
			tracedConfirm := row(t, tab, "commit → broker confirm @ 300 orders/s, LISTEN/NOTIFY (achieved 300/s), "+c.mode)
			require.Equal(t, "tracing off: p99 12.0 ms", tracedConfirm.Ratio)
			require.Empty(t, tracedConfirm.Target, "the targets are the tracing-off run's")
			traced := row(t, tab, "batches in flight), "+c.mode)
			require.Contains(t, traced.What, "1 relay, batch 100, pipelined (2 batches in flight)")
			require.Equal(t, c.drain, traced.Result)
			require.Equal(t, c.ratio, traced.Ratio, "against the same relay tracing off, not against A")
			require.Empty(t, traced.Target)
		}
		cycle := row(t, tab, "serial relay's cycle")
		require.Equal(t, "1.00 ms · 12.0 ms · 2.00 ms", cycle.Result)
		require.Equal(t, "claim 900 µs in the first tenth, 1.10 ms in the last", cycle.Ratio)
		require.Len(t, rows(tab, "cycle"), 1, "the split is the serial relay's only")

		a := row(t, tab, "1,000 in flight, 1 channel")
		require.Equal(t, "publisher 20.0 ms · broker 100 ms · idle 40%", a.CPU)

		peer := row(t, tab, "Watermill")
		require.Equal(t, "1 pipelined relay = 8.50× · serial 4.00× · batch 500 9.00×", peer.Ratio)
		require.Equal(t, "✓ pipelined relay ≥ 8× peer", peer.Target)

		api := row(t, tab, "POST /orders")
		require.Equal(t, "50% of B (16 writers)", api.Ratio)
		require.Equal(t, "2,000 orders/s · p50 7.00 ms · p99 20.0 ms · max 0", api.Result)
	})

	t.Run("LatencyTargetsAtTheTargetRateWithNotify", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(results())
		confirm := row(t, tab, "broker confirm @ 300 orders/s, LISTEN/NOTIFY")
		require.Equal(t, "✗ p99 ≤ 10.0 ms", confirm.Target)
		require.Contains(t, confirm.What, "(achieved 300/s)")
		reserved := row(t, tab, "inbox commit @ 300 orders/s, LISTEN/NOTIFY")
		require.Equal(t, "✓ p99 ≤ 30.0 ms", reserved.Target)
		require.Equal(t, "handler start p50 5.00 ms · p99 15.0 ms", reserved.Ratio)
		ceiling := row(t, tab, "broker confirm @ 3,990 orders/s (the writers' ceiling: limit B, 16 writers), LISTEN/NOTIFY (achieved 2,000/s)")
		require.Equal(t, "achieved = 50% of B (16 writers)", ceiling.Ratio)
		require.Empty(t, ceiling.Target, "the targets are for 300/s")
		polling := row(t, tab, "broker confirm @ 300 orders/s, polling")
		require.Equal(t, "error: boom second line", polling.Result, "an error stays on one line")
		require.Empty(t, polling.Target, "the targets are for LISTEN/NOTIFY")
	})

	t.Run("QuickRunShowsLatencyTargetsAtItsRate", func(t *testing.T) {
		t.Parallel()
		r := results()
		r.Latency = []bench.LatencyResult{
			{Rate: 200, Notify: true, Confirm: bench.Latencies{N: 1, P99: 5 * time.Millisecond}, Reserved: bench.Latencies{N: 1, P99: time.Second}},
			{Rate: 200, Notify: false, Confirm: bench.Latencies{N: 1, P99: 50 * time.Millisecond}},
		}
		tab := bench.BuildTable(r)
		require.Equal(t, "✓ p99 ≤ 10.0 ms (set for 300/s)", row(t, tab, "broker confirm @ 200 orders/s, LISTEN/NOTIFY").Target)
		require.Equal(t, "✗ p99 ≤ 30.0 ms (set for 300/s)", row(t, tab, "inbox commit @ 200 orders/s, LISTEN/NOTIFY").Target)
		require.Empty(t, row(t, tab, "broker confirm @ 200 orders/s, polling").Target)
	})

	t.Run("ScaleAndMemory", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(results())
		big := row(t, tab, "1,000,000 published")
		require.Equal(t, "claim 1.10× of 10,000", big.Ratio)
		require.Equal(t, "✓ claim within 20% of 10,000", big.Target)
		require.Empty(t, row(t, tab, "10,000 published").Target)
		mem := row(t, tab, "peak RSS")
		require.Equal(t, "30.0 MiB", mem.Result)
		require.Equal(t, "✓ ≤ 40 MiB", mem.Target)
	})

	t.Run("MissingReferenceIsNotMeasured", func(t *testing.T) {
		t.Parallel()
		r := results()
		r.LimitA = nil
		r.Peer.Err = errors.New("forwarder stuck")
		tab := bench.BuildTable(r)
		one := row(t, tab, "1 relay, batch 100, pipelined")
		require.Equal(t, "— of A (1 ch) · 2.13× serial", one.Ratio)
		require.Equal(t, "? ≥ 80% of A (not measured)", one.Target)
		peer := row(t, tab, "Watermill")
		require.Equal(t, "error: forwarder stuck", peer.Result)
		require.Equal(t, "? pipelined relay ≥ 8× peer (not measured)", peer.Target)
	})

	t.Run("OnlyThePhasesThatRan", func(t *testing.T) {
		t.Parallel()
		r := bench.Results{Sizes: bench.QuickSizes(), LimitA: []bench.Measured{{N: 1, Rate: 5000}}}
		require.Len(t, bench.BuildTable(r).Rows, 1)
	})
}

func TestReport(t *testing.T) {
	t.Parallel()
	r := results()
	r.Quick = true
	r.Command = "go run ./bench/cmd/bench -quick"
	r.Machine = bench.Machine{CPU: "AMD EPYC", Cores: 2, MemBytes: 24 << 30, Go: "go1.26.8 linux/amd64", Postgres: "15.20", RabbitMQ: "3.10.8"}
	out := bench.Report(r)
	require.True(t, strings.HasPrefix(out, "# outboxshop benchmarks (quick run)\n"))
	require.Contains(t, out, "- machine: AMD EPYC, 2 cores, 24.0 GiB RAM · go1.26.8 linux/amd64 · PostgreSQL 15.20 · RabbitMQ 3.10.8\n")
	require.Contains(t, out, "- command: `go run ./bench/cmd/bench -quick`\n")
	require.Contains(t, out, "**quick run**")
	require.Less(t, strings.Index(out, "command:"), strings.Index(out, "| # |"), "the command is above the table")
}

// batchedResults is a run of item 9 with round figures: limit C, then for each handler the
// inbox consumer with a transaction and an ack per message at concurrency 8 (the reference)
// and 32, and in batches of 8 and 16 with multiple acks every 8. B has no 2 or 4 writers.
func batchedResults() bench.Results {
	r := results()
	r.LimitB = []bench.Measured{{N: 8, Rate: 4_000}, {N: 16, Rate: 5_000}}
	perMessage := func(k bench.ConsumeKind, concurrency int, rate float64) bench.ConsumeResult {
		return bench.ConsumeResult{Kind: k, Concurrency: concurrency, Batch: 1, AckEvery: 1, Prefetch: 32, Messages: 200_000, Rate: rate}
	}
	batched := func(k bench.ConsumeKind, batch int, rate float64) bench.ConsumeResult {
		return bench.ConsumeResult{Kind: k, Concurrency: 32 / batch, Batch: batch, AckEvery: 8, Prefetch: 32, Messages: 200_000, Rate: rate}
	}
	r.Consume = []bench.ConsumeResult{
		{Kind: bench.ConsumeAckEach, Prefetch: 32, Messages: 200_000, Rate: 10_000},
		{Kind: bench.ConsumeAckMultiple, Prefetch: 32, Messages: 200_000, Rate: 15_000},
		perMessage(bench.ConsumeInboxNoop, 8, 2_000),
		perMessage(bench.ConsumeInboxNoop, 32, 2_500),
		batched(bench.ConsumeInboxNoop, 8, 7_500),
		batched(bench.ConsumeInboxNoop, 16, 6_500),
		perMessage(bench.ConsumeInboxSpread, 8, 800),
		perMessage(bench.ConsumeInboxSpread, 32, 1_000),
		batched(bench.ConsumeInboxSpread, 8, 2_000),
		batched(bench.ConsumeInboxSpread, 16, 1_500),
		perMessage(bench.ConsumeInboxHot, 8, 700),
		perMessage(bench.ConsumeInboxHot, 32, 600),
		batched(bench.ConsumeInboxHot, 8, 1_750),
		batched(bench.ConsumeInboxHot, 16, 1_400),
	}
	return r
}

// The rows of item 9 with batches of 8 and 16 beside a transaction per message.
const (
	noopBatch8    = "(quorum queue, prefetch 32, concurrency 4): a handler that does nothing (the inbox's insert and the commit); batches of 8 (4 transactions at once), multiple acks every 8"
	noopBatch16   = "(quorum queue, prefetch 32, concurrency 2): a handler that does nothing (the inbox's insert and the commit); batches of 16 (2 transactions at once), multiple acks every 8"
	spreadBatch8  = "concurrency 4): the warehouse's handler, orders spread over 10,000 SKUs; batches of 8"
	spreadBatch16 = "concurrency 2): the warehouse's handler, orders spread over 10,000 SKUs; batches of 16"
	hotBatch16    = "concurrency 2): the warehouse's handler, every order on one of the 5 hot SKUs; batches of 16"
)

func TestBatchedConsumeRows(t *testing.T) {
	t.Parallel()

	t.Run("TextsSayTheBatchAndTheAcks", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(batchedResults())
		require.Len(t, rows(tab, "inbox consumer drain"), 12)
		require.Len(t, rows(tab, "; a transaction per message, an ack per message"), 6, "every handler at 8 and 32")
		require.Len(t, rows(tab, "transactions at once), multiple acks every 8"), 6, "every handler in batches of 8 and 16")
		noop := row(t, tab, "(quorum queue, prefetch 32, concurrency 8): a handler that does nothing")
		require.Equal(t, "inbox consumer drain of 200,000 (quorum queue, prefetch 32, concurrency 8): a handler that does nothing (the inbox's insert and the commit); a transaction per message, an ack per message", noop.What)
		require.Equal(t, "inbox consumer drain of 200,000 "+noopBatch16, row(t, tab, noopBatch16).What)
		require.Equal(t, "9", row(t, tab, noopBatch16).Item)

		require.Equal(t, "batches of 32 (1 transaction at once), an ack per message", bench.ConsumeResult{Batch: 32, Concurrency: 1, AckEvery: 1}.Mode())
		require.Equal(t, "batches of 16 (2 transactions at once), filled for up to 1ms, multiple acks every 8",
			bench.ConsumeResult{Batch: 16, Concurrency: 2, AckEvery: 8, BatchWait: time.Millisecond}.Mode())
		require.Equal(t, "a transaction per message, multiple acks every 8", bench.ConsumeResult{Concurrency: 8}.Mode(),
			"zero: the library's defaults")
	})

	t.Run("RatiosAndTargets", func(t *testing.T) {
		t.Parallel()
		tab := bench.BuildTable(batchedResults())
		noop8 := row(t, tab, noopBatch8)
		require.Equal(t, "7,500 msg/s", noop8.Result)
		require.Equal(t, "75% of C (ack per message) · 150% of B's best (16 writers) · 3.75× a transaction per message (concurrency 8)", noop8.Ratio,
			"B has no 4 writers; against concurrency 8, not 32")
		require.Equal(t, "✓ ≥ 70% of C", noop8.Target)
		noop16 := row(t, tab, noopBatch16)
		require.Equal(t, "65% of C (ack per message) · 130% of B's best (16 writers) · 3.25× a transaction per message (concurrency 8)", noop16.Ratio)
		require.Equal(t, "✗ ≥ 70% of C", noop16.Target, "each batched row is read on its own")

		spread8 := row(t, tab, spreadBatch8)
		require.Equal(t, "20% of C (ack per message) · 40% of B's best (16 writers) · 2.50× a transaction per message (concurrency 8)", spread8.Ratio)
		require.Equal(t, "✓ ≥ 2×", spread8.Target)
		spread16 := row(t, tab, spreadBatch16)
		require.Equal(t, "15% of C (ack per message) · 30% of B's best (16 writers) · 1.88× a transaction per message (concurrency 8)", spread16.Ratio)
		require.Equal(t, "✗ ≥ 2×", spread16.Target)

		hot16 := row(t, tab, hotBatch16)
		require.Equal(t, "14% of C (ack per message) · 28% of B's best (16 writers) · 2.00× a transaction per message (concurrency 8)", hot16.Ratio)
		require.Empty(t, hot16.Target, "no target on the hot SKUs")

		for _, perMessage := range rows(tab, "a transaction per message, an ack per message") {
			require.Empty(t, perMessage.Target, perMessage.What)
			require.NotContains(t, perMessage.Ratio, "a transaction per message", perMessage.What)
		}
		require.Equal(t, "20% of C (ack per message) · 50% of B (8 writers)",
			row(t, tab, "concurrency 8): a handler that does nothing (the inbox's insert and the commit); a transaction per message").Ratio)
	})

	t.Run("MissingPerMessageRow", func(t *testing.T) {
		t.Parallel()
		r := batchedResults()
		r.Consume[6].Err = errors.New("channel closed") // spread, a transaction per message, concurrency 8
		tab := bench.BuildTable(r)
		spread8 := row(t, tab, spreadBatch8)
		require.Equal(t, "20% of C (ack per message) · 40% of B's best (16 writers) · — a transaction per message (concurrency 8)", spread8.Ratio,
			"concurrency 32's drain is no reference")
		require.Equal(t, "? ≥ 2× (not measured)", spread8.Target)
		require.Equal(t, "✓ ≥ 70% of C", row(t, tab, noopBatch8).Target, "the other handlers keep theirs")

		r = batchedResults()
		r.Consume = append(r.Consume[:10], r.Consume[11:]...) // hot at concurrency 8 not run
		require.Equal(t, "14% of C (ack per message) · 28% of B's best (16 writers) · — a transaction per message (concurrency 8)",
			row(t, bench.BuildTable(r), hotBatch16).Ratio)
	})

	t.Run("MissingC", func(t *testing.T) {
		t.Parallel()
		r := batchedResults()
		r.Consume[0].Err = errors.New("channel closed")
		tab := bench.BuildTable(r)
		noop8 := row(t, tab, noopBatch8)
		require.Equal(t, "— of C (ack per message) · 150% of B's best (16 writers) · 3.75× a transaction per message (concurrency 8)", noop8.Ratio)
		require.Equal(t, "? ≥ 70% of C (not measured)", noop8.Target)
		require.Equal(t, "✓ ≥ 2×", row(t, tab, spreadBatch8).Target, "the spread target needs no C")
	})

	t.Run("AFailedBatchedDrain", func(t *testing.T) {
		t.Parallel()
		r := batchedResults()
		r.Consume[4].Err = errors.New("processed 10 of 200000 messages\nnone for 30s")
		r.Consume[8].Err = errors.New("too many clients")
		tab := bench.BuildTable(r)
		noop8 := row(t, tab, noopBatch8)
		require.Equal(t, "error: processed 10 of 200000 messages none for 30s", noop8.Result)
		require.Equal(t, "— of C (ack per message) · — of B's best (16 writers) · — a transaction per message (concurrency 8)", noop8.Ratio)
		require.Equal(t, "? ≥ 70% of C (not measured)", noop8.Target)
		require.Equal(t, "? ≥ 2× (not measured)", row(t, tab, spreadBatch8).Target)
		require.Equal(t, "✗ ≥ 70% of C", row(t, tab, noopBatch16).Target, "the other batch keeps its row")
	})
}
