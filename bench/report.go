package bench

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"
)

// Targets read off the table (never a timed test).
const (
	TargetDrainOfLimitA   = 0.80                  // one pipelined relay's drain ≥ 80% of limit A, 1 channel
	TargetDrainOfLimitA2  = 0.90                  // two or more pipelined relays ≥ 90% of limit A, as many channels
	TargetTimesPeer       = 8                     // one pipelined relay ≥ 8× Watermill's forwarder
	TargetConfirmP99      = 10 * time.Millisecond // commit→confirm p99 at 300/s with NOTIFY
	TargetReservedP99     = 30 * time.Millisecond // commit→reservation p99 at 300/s with NOTIFY
	TargetLatencyRate     = 300
	TargetClaimGrowth     = 1.20 // claim cost at the largest table within 20% of the smallest
	TargetHotClaim        = 1.50 // claim cost behind one aggregate's backlog ≤ 1.5× the same backlog spread
	TargetRelayPeakRSSMiB = 40
	// TargetMultipleAckBrokerCPU: the broker's CPU per 1,000 deliveries acknowledged every
	// 16th with multiple at most 65% of its CPU per 1,000 acknowledged one by one (limit C).
	TargetMultipleAckBrokerCPU = 0.65
	// TargetBatchedNoopOfC: the inbox consumer in batches with multiple acks, with a handler
	// that does nothing, at least 70% of limit C acknowledging each delivery.
	TargetBatchedNoopOfC = 0.70
	// TargetBatchedSpreadTimes: the inbox consumer in batches with multiple acks, with the
	// warehouse's handler on spread orders, at least 2× the same drain with a transaction and
	// an ack per message at concurrency [ConsumeReferenceConcurrency].
	TargetBatchedSpreadTimes = 2
	// Item 10, the WAL relay: its drain of a spread backlog at least 85% of limit A (1
	// channel), of one aggregate's at least 75%, and at least 10× Watermill's forwarder;
	// commit→confirm p99 at most 8 ms and commit→reservation p99 at most 20 ms at
	// [TargetLatencyRate]; commit→confirm p99 at most 50 ms writing at 80% of what it can
	// sustain ([WALResult.SustainableRate]).
	TargetWALDrainOfLimitA    = 0.85
	TargetWALHotOfLimitA      = 0.75
	TargetWALTimesPeer        = 10
	TargetWALConfirmP99       = 8 * time.Millisecond
	TargetWALReservedP99      = 20 * time.Millisecond
	TargetWALSustainedP99     = 50 * time.Millisecond
	TargetWALSustainedOfDrain = 0.80
)

// ConsumeReferenceConcurrency is the concurrency of the inbox consumer's drain with a
// transaction per message that its drains in batches are compared with: the warehouse's
// (WAREHOUSE_CONSUMER_CONCURRENCY's default).
const ConsumeReferenceConcurrency = 8

// Report renders the run: a title, the machine, the command, and the table.
func Report(r Results) string {
	var b strings.Builder
	title := "# outboxshop benchmarks"
	if r.Quick {
		title += " (quick run)"
	}
	fmt.Fprintf(&b, "%s\n\n", title)
	fmt.Fprintf(&b, "- machine: %s\n", r.Machine)
	fmt.Fprintf(&b, "- command: `%s`\n", r.Command)
	fmt.Fprintf(&b, "- run: %s, %s\n", r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Took.Round(time.Second))
	if r.Quick {
		b.WriteString("- **quick run**: small sizes, for checking the harness; the figures are indicative only.\n")
	}
	b.WriteString("\n")
	b.WriteString(BuildTable(r).Markdown())
	return b.String()
}

// BuildTable turns the figures into rows, with each ratio taken against a limit or the peer
// measured in the same run.
func BuildTable(r Results) Table {
	var t Table
	s := r.Sizes
	// Limit A of N channels is the fastest of its measurements: amqp091-go's own socket, and
	// the socket that batches writes as the outbox publisher's does.
	limitA := map[int]float64{}
	limitACPU := map[int]*CPUUsage{} // the CPU of limit A's faster socket
	for _, m := range r.LimitA {
		row := Row{Item: "A", What: fmt.Sprintf("RabbitMQ publish: persistent 1 KiB, confirms, %s in flight, %d channel%s", FormatCount(s.ConfirmWindow), m.N, plural(m.N)),
			Result: rateCell(m, "msg/s")}
		if m.BatchedWrites {
			row.What += ", writes batched (the publisher's socket)"
		}
		if m.Err == nil {
			row.CPU = FormatCPU(m.CPU, "publisher")
		}
		t.Add(row)
		if m.Err == nil && m.Rate > limitA[m.N] {
			limitA[m.N], limitACPU[m.N] = m.Rate, m.CPU
		}
	}
	limitB := map[int]float64{}
	for _, m := range r.LimitB {
		t.Add(Row{Item: "B", What: fmt.Sprintf("PostgreSQL: orders row + outbox.Add (1 KiB) + commit, %d writers", m.N),
			Result: rateCell(m, "tx/s")})
		if m.Err == nil {
			limitB[m.N] = m.Rate
		}
	}

	// The drains: the serial relay (one batch in flight) for the ratio, then the pipelined
	// relay, whose rows carry the targets: at the run's batch size, and with as many messages
	// in flight as limit A keeps unconfirmed (batch × in flight = its window).
	type drainKey struct{ n, inFlight, batch int }
	key := func(m DrainMeasured) drainKey { return drainKey{m.N, m.InFlight, cmp.Or(m.Batch, r.BatchSize)} }
	drain := map[drainKey]float64{}
	for _, m := range r.Drain {
		if m.Err == nil && m.Tracing == TracingOff {
			drain[key(m)] = m.Rate
		}
	}
	for _, m := range r.Drain {
		batch := cmp.Or(m.Batch, r.BatchSize)
		row := Row{Item: "3", What: fmt.Sprintf("relay drain of %s rows, %d relay%s, batch %d, %s", FormatCount(s.Backlog), m.N, plural(m.N), batch, inFlightText(m.InFlight))}
		if m.InFlight > 1 && batch*m.InFlight == s.ConfirmWindow && batch != r.BatchSize {
			row.What += fmt.Sprintf(": %s in flight, as limit A", FormatCount(s.ConfirmWindow))
		}
		if m.Tracing != TracingOff {
			// The same relay as the row with its key, tracing on: its ratio is to that row,
			// tracing off, and the targets are the tracing-off row's.
			row.What += ", " + m.Tracing.String()
			off, ok := drain[key(m)]
			if m.Err != nil {
				row.Result = errorCell(m.Err)
			} else {
				row.Result = FormatRate(m.Rate, "rows/s")
				row.CPU = FormatCPU(m.CPU, "relay")
				if ok {
					row.Ratio = FormatPercent(Ratio(m.Rate, off)) + " of tracing off"
				}
			}
			t.Add(row)
			continue
		}
		ratio := math.NaN()
		if m.Err != nil {
			row.Result = errorCell(m.Err)
		} else {
			row.Result = FormatRate(m.Rate, "rows/s")
			ratio = Ratio(m.Rate, nanIfMissing(limitA, m.N))
			row.CPU = FormatCPU(m.CPU, "relay")
		}
		row.Ratio = FormatPercent(ratio) + fmt.Sprintf(" of A (%d ch)", m.N)
		if m.InFlight > 1 {
			if serial, ok := drain[drainKey{m.N, 1, r.BatchSize}]; ok && m.Err == nil && batch == r.BatchSize {
				row.Ratio += " · " + FormatTimes(Ratio(m.Rate, serial)) + " serial"
			}
			if m.N == 1 {
				row.Target = AtLeast(ratio, TargetDrainOfLimitA, "≥ 80% of A").String()
			} else {
				row.Target = AtLeast(ratio, TargetDrainOfLimitA2, "≥ 90% of A").String()
			}
		}
		if share := CPUShare(limitACPU[m.N], m.CPU); m.Err == nil && !math.IsNaN(share) {
			// Where both run the machine equally busy, this is the share of A the row can
			// reach: what the CPU per message allows, whatever the relay's design.
			row.Ratio += " · A's CPU per msg " + FormatPercent(share) + " of this row's"
		}
		t.Add(row)
	}
	for _, m := range r.Drain {
		if m.Err != nil || m.N != 1 || m.InFlight != 1 {
			continue
		}
		row := Row{Item: "3", What: fmt.Sprintf("… the serial relay's cycle (median of %s): claim · publish to last confirm · mark + commit", FormatCount(m.Cycles)),
			Result: fmt.Sprintf("%s · %s · %s", FormatLatency(m.Claim), FormatLatency(m.Publish), FormatLatency(m.Finish))}
		if m.FirstClaims > 0 {
			row.Ratio = fmt.Sprintf("claim %s in the first tenth, %s in the last", FormatLatency(m.FirstClaims), FormatLatency(m.LastClaims))
		}
		t.Add(row)
	}
	if p := r.Peer; p != nil {
		row := Row{Item: "4", What: fmt.Sprintf("Watermill forwarder drain of %s rows (watermill-sql pgx → watermill-amqp, confirms)", FormatCount(p.N)),
			Result: rateCell(*p, "rows/s")}
		times, serial, window := math.NaN(), math.NaN(), math.NaN()
		if p.Err == nil {
			row.CPU = FormatCPU(p.CPU, "forwarder")
			times = Ratio(nanIfMissing(drain, drainKey{1, r.InFlight, r.BatchSize}), p.Rate)
			serial = Ratio(nanIfMissing(drain, drainKey{1, 1, r.BatchSize}), p.Rate)
			window = Ratio(nanIfMissing(drain, drainKey{1, r.InFlight, WindowBatch(s, r.InFlight)}), p.Rate)
		}
		row.Ratio = "1 pipelined relay = " + FormatTimes(times)
		if !math.IsNaN(serial) {
			row.Ratio += " · serial " + FormatTimes(serial)
		}
		if !math.IsNaN(window) && WindowBatch(s, r.InFlight) != r.BatchSize {
			row.Ratio += fmt.Sprintf(" · batch %d %s", WindowBatch(s, r.InFlight), FormatTimes(window))
		}
		row.Target = AtLeast(times, TargetTimesPeer, "pipelined relay ≥ 8× peer").String()
		t.Add(row)
	}

	// The latency targets are set for 1,000 orders/s with LISTEN/NOTIFY; a run without that
	// rate (-quick) shows them at its highest rate below it, saying so.
	targetRate := 0
	for _, l := range r.Latency {
		if l.Notify && l.Tracing == TracingOff && l.Rate <= TargetLatencyRate {
			targetRate = max(targetRate, l.Rate)
		}
	}
	note := ""
	if targetRate != TargetLatencyRate {
		note = fmt.Sprintf(" (set for %s/s)", FormatCount(TargetLatencyRate))
	}
	for _, l := range r.Latency {
		what := fmt.Sprintf("@ %s orders/s, %s", FormatCount(l.Rate), wakeUp(l.Notify))
		if l.Ceiling {
			what = fmt.Sprintf("@ %s orders/s (the writers' ceiling: limit B, %d writers), %s", FormatCount(l.Rate), latencyWriters, wakeUp(l.Notify))
		}
		if l.Achieved > 0 {
			what += fmt.Sprintf(" (achieved %s/s)", FormatCount(int(math.Round(l.Achieved))))
		}
		if l.Tracing != TracingOff {
			what += ", " + l.Tracing.String()
		}
		target := l.Notify && l.Tracing == TracingOff && l.Rate == targetRate
		confirm := Row{Item: "5", What: "commit → broker confirm " + what}
		reserved := Row{Item: "5", What: "commit → warehouse inbox commit " + what}
		if l.Err != nil {
			confirm.Result, reserved.Result = errorCell(l.Err), errorCell(l.Err)
		} else {
			confirm.Result, reserved.Result = FormatLatencies(l.Confirm), FormatLatencies(l.Reserved)
			if l.Ceiling {
				confirm.Ratio = fmt.Sprintf("achieved = %s of B (%d writers)", FormatPercent(Ratio(l.Achieved, nanIfMissing(limitB, latencyWriters))), latencyWriters)
			}
			if l.Handled.N > 0 {
				reserved.Ratio = fmt.Sprintf("handler start p50 %s · p99 %s", FormatLatency(l.Handled.P50), FormatLatency(l.Handled.P99))
			}
			if l.Missing > 0 {
				reserved.Result += fmt.Sprintf("; %s of %s not reserved within %s of the last order (saturated: lower bounds)",
					FormatCount(l.Missing), FormatCount(l.Reserved.N+l.Missing), catchUp)
			}
		}
		if l.Tracing != TracingOff && l.Err == nil {
			for _, off := range r.Latency {
				if off.Notify && off.Tracing == TracingOff && off.Rate == l.Rate && off.Err == nil {
					confirm.Ratio = "tracing off: p99 " + FormatLatency(off.Confirm.P99)
					reserved.Ratio = "tracing off: p99 " + FormatLatency(off.Reserved.P99)
				}
			}
		}
		if target {
			confirm.Target = latencyCheck(l, l.Confirm, TargetConfirmP99, note).String()
			reserved.Target = latencyCheck(l, l.Reserved, TargetReservedP99, note).String()
		}
		t.Add(confirm)
		t.Add(reserved)
	}

	var base time.Duration
	for i, sc := range r.Scale {
		row := Row{Item: "6", What: fmt.Sprintf("claim + mark of batches of 100, %s published rows in the table", FormatCount(sc.Published))}
		growth := math.NaN()
		if sc.Err != nil {
			row.Result = errorCell(sc.Err)
		} else {
			row.Result = fmt.Sprintf("claim %s/row · mark %s/row", FormatLatency(sc.Claim), FormatLatency(sc.Mark))
			if i == 0 {
				base = sc.Claim
			} else if base > 0 {
				growth = Ratio(float64(sc.Claim), float64(base))
				row.Ratio = "claim " + FormatTimes(growth) + " of " + FormatCount(r.Scale[0].Published)
			}
		}
		if i == len(r.Scale)-1 && i > 0 {
			row.Target = AtMost(growth, TargetClaimGrowth, "claim within 20% of "+FormatCount(r.Scale[0].Published)).String()
		}
		t.Add(row)
	}

	if h := r.Hot; h != nil {
		row := Row{Item: "6b", What: fmt.Sprintf("claim of a batch of 100, %s pending rows of one aggregate + 100 others", FormatCount(h.Backlog))}
		ratio := math.NaN()
		if h.Err != nil {
			row.Result = errorCell(h.Err)
		} else {
			ratio = Ratio(float64(h.Hot), float64(h.Spread))
			row.Result = fmt.Sprintf("claim %s/batch (spread over %s aggregates: %s)", FormatLatency(h.Hot), FormatCount(h.Backlog), FormatLatency(h.Spread))
			row.Ratio = FormatTimes(ratio) + " of spread"
		}
		row.Target = AtMost(ratio, TargetHotClaim, "≤ 1.5× the spread backlog").String()
		t.Add(row)
	}

	if a := r.API; a != nil {
		row := Row{Item: "7", What: fmt.Sprintf("orders API: POST /orders, loadgen with %d in flight, in-process service", a.Concurrency)}
		ratio := math.NaN()
		if a.Err != nil {
			row.Result = errorCell(a.Err)
		} else {
			row.Result = fmt.Sprintf("%s · p50 %s · p99 %s · max %s", FormatRate(a.Rate, "orders/s"),
				FormatLatency(a.Latency.P50), FormatLatency(a.Latency.P99), FormatLatency(a.Latency.Max))
			if a.Failed > 0 {
				row.Result += fmt.Sprintf(" (%d failed: %s)", a.Failed, a.FirstFailure)
			}
			ratio = Ratio(a.Rate, nanIfMissing(limitB, a.Concurrency))
		}
		row.Ratio = FormatPercent(ratio) + fmt.Sprintf(" of B (%d writers)", a.Concurrency)
		t.Add(row)
	}

	if m := r.Memory; m != nil {
		row := Row{Item: "8", What: fmt.Sprintf("relay process peak RSS (VmHWM) draining %s rows", FormatCount(m.Rows))}
		mib := math.NaN()
		if m.Err != nil {
			row.Result = errorCell(m.Err)
		} else {
			row.Result = FormatMiB(m.PeakRSS)
			row.Ratio = "drained at " + FormatRate(m.Rate, "rows/s")
			mib = float64(m.PeakRSS) / (1 << 20)
		}
		row.Target = AtMost(mib, TargetRelayPeakRSSMiB, "≤ 40 MiB").String()
		t.Add(row)
	}
	for _, row := range consumeRows(r.Consume, r.LimitB) {
		t.Add(row)
	}
	if w := r.WAL; w != nil {
		peer := math.NaN()
		if r.Peer != nil && r.Peer.Err == nil {
			peer = r.Peer.Rate
		}
		for _, row := range walRows(*w, nanIfMissing(limitA, 1), limitACPU[1], peer) {
			t.Add(row)
		}
	}
	return t
}

// relayName names a relay of item 10 in the table.
func relayName(relay string) string {
	switch relay {
	case RelayWAL:
		return "WAL relay"
	case RelayWALDelete:
		return "WAL relay (DeletePublished)"
	}
	return "polling relay"
}

// walRows are the rows of item 10: the two relays' drains as shares of limit A with one
// channel (one relay, as row 3's one-relay rows), the WAL relay's also as a multiple of the
// polling relay's and of Watermill's forwarder; the latencies; the writers beside each
// relay; and the kill.
func walRows(w WALResult, limitA float64, limitACPU *CPUUsage, peer float64) []Row {
	if w.Err != nil {
		return []Row{{Item: "10", What: "WAL relay beside the polling relay (private server)", Result: errorCell(w.Err)}}
	}
	rows := []Row{{Item: "10", What: "the private server of item 10", Result: w.Server}}
	for _, d := range w.Drains {
		row := Row{Item: "10", What: fmt.Sprintf("%s drain of %s rows%s, batch %d, %s", relayName(d.Relay), FormatCount(d.Rows), hotText(d.Hot), w.Batch, inFlightText(w.InFlight))}
		ratio := math.NaN()
		if d.Err != nil {
			row.Result = errorCell(d.Err)
		} else {
			row.Result = FormatRate(d.Rate, "rows/s")
			if d.Bounded {
				row.Result += fmt.Sprintf(" (%s published in the time bound)", FormatCount(d.Published))
			}
			ratio = Ratio(d.Rate, limitA)
			row.CPU = FormatCPU(d.CPU, "relay")
		}
		row.Ratio = FormatPercent(ratio) + " of A (1 ch)"
		if isWAL(d.Relay) {
			if poll := w.drainRate(RelayPoll, d.Hot); poll > 0 && d.Err == nil {
				row.Ratio += " · " + FormatTimes(Ratio(d.Rate, poll)) + " polling"
			}
			if d.Hot {
				row.Target = AtLeast(ratio, TargetWALHotOfLimitA, "≥ 75% of A").String()
			} else {
				row.Target = AtLeast(ratio, TargetWALDrainOfLimitA, "≥ 85% of A").String()
			}
		}
		if share := CPUShare(limitACPU, d.CPU); d.Err == nil && !math.IsNaN(share) {
			row.Ratio += " · A's CPU per msg " + FormatPercent(share) + " of this row's"
		}
		rows = append(rows, row)
		if isWAL(d.Relay) && !d.Hot {
			times := math.NaN()
			if d.Err == nil {
				times = Ratio(d.Rate, peer)
			}
			rows = append(rows, Row{Item: "10", What: "… the " + relayName(d.Relay) + "'s drain against Watermill's forwarder (item 4)",
				Ratio: FormatTimes(times), Target: AtLeast(times, TargetWALTimesPeer, "≥ 10× peer").String()})
		}
	}
	for _, l := range w.Latency {
		name := relayName(l.Relay)
		what := fmt.Sprintf("@ %s orders/s, %s", FormatCount(l.Rate), name)
		if l.Sustained {
			what = fmt.Sprintf("sustained @ %s orders/s (80%% of the lower of the WAL relay's drain and the writers' rate beside it) for %s, %s",
				FormatCount(l.Rate), l.Duration, name)
		}
		if l.Achieved > 0 {
			what += fmt.Sprintf(" (achieved %s/s)", FormatCount(int(math.Round(l.Achieved))))
		}
		confirm := Row{Item: "10", What: "commit → broker confirm " + what}
		reserved := Row{Item: "10", What: "commit → warehouse inbox commit " + what}
		if l.Err != nil {
			confirm.Result, reserved.Result = errorCell(l.Err), errorCell(l.Err)
		} else {
			confirm.Result, reserved.Result = FormatLatencies(l.Confirm), FormatLatencies(l.Reserved)
			if l.Missing > 0 {
				reserved.Result += fmt.Sprintf("; %s of %s not reserved within %s of the last order (saturated: lower bounds)",
					FormatCount(l.Missing), FormatCount(l.Reserved.N+l.Missing), catchUp)
			}
			if l.Sustained && l.Achieved > 0 {
				confirm.Ratio = "achieved " + FormatPercent(Ratio(l.Achieved, w.drainRate(RelayWAL, false))) + " of the WAL relay's drain"
			}
		}
		switch {
		case l.Relay == RelayWAL && l.Sustained:
			confirm.Target = latencyCheck(l, l.Confirm, TargetWALSustainedP99, "").String()
		case l.Relay == RelayWAL:
			confirm.Target = latencyCheck(l, l.Confirm, TargetWALConfirmP99, "").String()
			reserved.Target = latencyCheck(l, l.Reserved, TargetWALReservedP99, "").String()
		}
		rows = append(rows, confirm)
		if !l.Sustained {
			rows = append(rows, reserved)
		}
	}
	none := math.NaN()
	for _, m := range w.Writers {
		if m.Relay == RelayNone && m.Err == nil {
			none = m.Rate
		}
	}
	for _, m := range w.Writers {
		what := map[string]string{RelayNone: "no relay", RelayPoll: "the polling relay publishing", RelayWAL: "the WAL relay publishing"}[m.Relay]
		row := Row{Item: "10", What: fmt.Sprintf("writers (B's transaction), %d writers, %s", m.Writers, what)}
		if m.Err != nil {
			row.Result = errorCell(m.Err)
		} else {
			row.Result = FormatRate(m.Rate, "tx/s")
			if m.Relay != RelayNone {
				row.Ratio = FormatPercent(Ratio(m.Rate, none)) + " of no relay"
			}
		}
		rows = append(rows, row)
	}
	if k := w.Kill; k != nil {
		row := Row{Item: "10", What: fmt.Sprintf("WAL relay process SIGKILLed mid-drain of %s rows, then started again", FormatCount(k.Rows))}
		if k.Err != nil {
			row.Result = errorCell(k.Err)
		} else {
			row.Result = fmt.Sprintf("%s duplicates · first publish %s after the restart · all published %s after the kill",
				FormatCount(int(k.Duplicates)), FormatLatency(k.FirstPublish), FormatLatency(k.Drained))
			row.Ratio = fmt.Sprintf("killed at %s of %s in the queue · 0 lost", FormatCount(int(k.KilledAt)), FormatCount(k.Rows))
		}
		rows = append(rows, row)
	}
	return rows
}

// consumeRows are the rows of item 9: limit C, a bare consumer acknowledging each delivery
// and then every 16th with multiple (the second as a multiple of the first, with the target
// on the broker's CPU); then the inbox consumer's drains, each as a share of C acknowledging
// each delivery (at the same prefetch) and of limit B with as many writers as the consumer
// has transactions at once, or, when B was not measured with that many, of the run's best
// B. A drain in batches is also a multiple of the same handler's drain with a transaction
// per message at [ConsumeReferenceConcurrency], and carries its handler's target, if any:
// with no handler, a share of C ([TargetBatchedNoopOfC]); with the warehouse's on spread
// orders, that multiple ([TargetBatchedSpreadTimes]).
func consumeRows(cs []ConsumeResult, limitB []Measured) []Row {
	c, cCPU := math.NaN(), (*CPUUsage)(nil)
	perMessage := map[ConsumeKind]float64{} // at ConsumeReferenceConcurrency
	for _, m := range cs {
		if m.Kind == ConsumeAckEach && m.Err == nil {
			c, cCPU = m.Rate, m.CPU
		}
		if m.Kind.Inbox() && !m.Batched() && m.Concurrency == ConsumeReferenceConcurrency && m.Err == nil {
			perMessage[m.Kind] = m.Rate
		}
	}
	var rows []Row
	for _, m := range cs {
		if !m.Kind.Inbox() {
			ack := "ack per message"
			if m.Kind == ConsumeAckMultiple {
				ack = fmt.Sprintf("ack with multiple every %dth", MultipleAckEvery)
			}
			row := Row{Item: "C", What: fmt.Sprintf("RabbitMQ consume: %s persistent 1 KiB from a quorum queue (the shop's), prefetch %d, %s", FormatCount(m.Messages), m.Prefetch, ack)}
			share := math.NaN()
			if m.Err != nil {
				row.Result = errorCell(m.Err)
			} else {
				row.Result = FormatRate(m.Rate, "msg/s")
				row.CPU = FormatCPU(m.CPU, "consumer")
			}
			if m.Kind == ConsumeAckMultiple {
				if m.Err == nil {
					share = Ratio(brokerPerThousand(m.CPU), brokerPerThousand(cCPU))
					row.Ratio = FormatTimes(Ratio(m.Rate, c)) + " ack per message"
					if !math.IsNaN(share) {
						row.Ratio += " · broker CPU per msg " + FormatPercent(share) + " of ack per message's"
					}
				}
				row.Target = AtMost(share, TargetMultipleAckBrokerCPU, "broker CPU per 1,000 ≤ 65% of ack per message's").String()
			}
			rows = append(rows, row)
			continue
		}
		row := Row{Item: "9", What: fmt.Sprintf("inbox consumer drain of %s (quorum queue, prefetch %d, concurrency %d): %s; %s",
			FormatCount(m.Messages), m.Prefetch, m.Concurrency, consumeHandlerText(m.Kind), m.Mode())}
		rate := math.NaN()
		if m.Err != nil {
			row.Result = errorCell(m.Err)
		} else {
			rate = m.Rate
			row.Result = FormatRate(m.Rate, "msg/s")
			if m.Failed > 0 {
				row.Result += fmt.Sprintf(" (%s attempts failed and retried)", FormatCount(m.Failed))
			}
			row.CPU = FormatCPU(m.CPU, "consumer")
		}
		ofC := Ratio(rate, c)
		row.Ratio = FormatPercent(ofC) + " of C (ack per message) · " + shareOfB(rate, m.Concurrency, limitB)
		if m.Batched() {
			times := Ratio(rate, nanIfMissing(perMessage, m.Kind))
			row.Ratio += fmt.Sprintf(" · %s a transaction per message (concurrency %d)", FormatTimes(times), ConsumeReferenceConcurrency)
			switch m.Kind {
			case ConsumeInboxNoop:
				row.Target = AtLeast(ofC, TargetBatchedNoopOfC, "≥ 70% of C").String()
			case ConsumeInboxSpread:
				row.Target = AtLeast(times, TargetBatchedSpreadTimes, "≥ 2×").String()
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// shareOfB renders rate as a share of limit B with n writers, or of the run's best B when B
// was not measured with n (or failed there).
func shareOfB(rate float64, n int, limitB []Measured) string {
	best, bestN := 0.0, 0
	for _, m := range limitB {
		if m.Err != nil {
			continue
		}
		if m.N == n {
			return FormatPercent(Ratio(rate, m.Rate)) + fmt.Sprintf(" of B (%d writers)", n)
		}
		if m.Rate > best {
			best, bestN = m.Rate, m.N
		}
	}
	if bestN == 0 {
		return fmt.Sprintf("— of B (%d writers)", n)
	}
	return FormatPercent(Ratio(rate, best)) + fmt.Sprintf(" of B's best (%d writers)", bestN)
}

// consumeHandlerText says what the inbox consumer's handler of kind does.
func consumeHandlerText(k ConsumeKind) string {
	switch k {
	case ConsumeInboxNoop:
		return "a handler that does nothing (the inbox's insert and the commit)"
	case ConsumeInboxSpread:
		return fmt.Sprintf("the warehouse's handler, orders spread over %s SKUs", FormatCount(SpreadSKUs))
	case ConsumeInboxHot:
		return fmt.Sprintf("the warehouse's handler, every order on one of the %d hot SKUs", len(skus))
	}
	return k.String()
}

// brokerPerThousand is the broker's CPU per 1,000 messages of u, or NaN when unknown.
func brokerPerThousand(u *CPUUsage) float64 {
	if u == nil {
		return math.NaN()
	}
	if d := u.PerThousand(u.Broker); d >= 0 {
		return float64(d)
	}
	return math.NaN()
}

func latencyCheck(l LatencyResult, lat Latencies, limit time.Duration, note string) Check {
	got := math.NaN()
	if l.Err == nil && lat.N > 0 {
		got = float64(lat.P99)
	}
	return AtMost(got, float64(limit), "p99 ≤ "+FormatLatency(limit)+note)
}

func rateCell(m Measured, unit string) string {
	if m.Err != nil {
		return errorCell(m.Err)
	}
	return FormatRate(m.Rate, unit)
}

func nanIfMissing[K comparable](m map[K]float64, k K) float64 {
	if v, ok := m[k]; ok {
		return v
	}
	return math.NaN()
}

// inFlightText names a relay by its batches in flight.
func inFlightText(n int) string {
	if n == 1 {
		return "serial (1 batch in flight)"
	}
	return fmt.Sprintf("pipelined (%d batches in flight)", n)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
