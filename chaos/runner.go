package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxshop/outboxshop/e2e/verify"
	"github.com/outboxshop/outboxshop/loadgen"
)

// Options configure [Run].
type Options struct {
	// Target runs the shop. Required.
	Target Target
	// Rate is the load in orders per second. Default 40.
	Rate float64
	// Load is how long orders are placed. Default 8s.
	Load time.Duration
	// RetryFor is how long a client keeps retrying an order with its Idempotency-Key through
	// an outage. Default 60s.
	RetryFor time.Duration
	// DrainTimeout bounds the wait, after the load and the heal, for every invariant to hold.
	// Default 90s.
	DrainTimeout time.Duration
	// Progress receives a line per phase of each scenario. nil discards.
	Progress io.Writer
	// Verbose adds the load generator's progress to Progress, and tells Run that the caller
	// prints every scenario's details ([Details]) with the table. Without it, Progress gets
	// the details of a scenario that failed, as it ends: either way they are printed once.
	Verbose bool
	// Logger receives debug lines of the runner and the load generator. nil discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	o.Rate = cmp.Or(o.Rate, 40)
	o.Load = cmp.Or(o.Load, 8*time.Second)
	o.RetryFor = cmp.Or(o.RetryFor, 60*time.Second)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, 90*time.Second)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Run prepares the target, runs the scenarios one after the other, each on a fresh shop, and
// closes the target, also when ctx is cancelled. It returns an outcome per scenario that ran;
// the error is about the runner itself (the target could not be prepared, ctx ended), not
// about a scenario that failed.
func Run(ctx context.Context, scenarios []Scenario, opts Options) (outcomes []Outcome, err error) {
	if opts.Target == nil {
		return nil, errors.New("chaos: Options.Target is required")
	}
	opts = opts.withDefaults()
	start := time.Now()
	say := func(scenario, phase, msg string) {
		fmt.Fprintf(opts.Progress, "[%6.1fs] %-22s %-15s %s\n", time.Since(start).Seconds(), scenario, phase, msg)
	}
	defer func() {
		if cerr := opts.Target.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close the %s target: %w", opts.Target.Name(), cerr))
		}
	}()
	say("", "starting", fmt.Sprintf("target %s: preparing", opts.Target.Name()))
	if err := opts.Target.Prepare(ctx, func(msg string) { say("", "starting", msg) }); err != nil {
		return nil, fmt.Errorf("prepare the %s target: %w", opts.Target.Name(), err)
	}
	for _, sc := range scenarios {
		if ctx.Err() != nil {
			return outcomes, ctx.Err()
		}
		o := runScenario(ctx, sc, opts, func(phase, msg string) { say(sc.Name, phase, msg) })
		say(sc.Name, o.Result(), fmt.Sprintf("in %s", formatDuration(o.Elapsed)))
		if !opts.Verbose && !o.Passed() {
			fmt.Fprint(opts.Progress, indent(Details([]Outcome{o})))
		}
		outcomes = append(outcomes, o)
	}
	return outcomes, ctx.Err()
}

func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString("    " + line)
	}
	return b.String()
}

// initialStock is what each scenario sets through PUT /stock/{sku} before the load: enough
// for most orders, so that some are reserved, some rejected (BAG-1 runs out early).
func initialStock(rate float64, load time.Duration) map[string]int64 {
	base := max(int64(rate*load.Seconds()*0.6), 20)
	return map[string]int64{"BOOK-1": base, "MUG-1": base, "TEE-1": base, "PEN-1": base, "BAG-1": max(base/8, 3)}
}

// runScenario runs one scenario on a fresh shop and never panics on a broken shop: every
// problem ends up in the outcome's failures.
func runScenario(ctx context.Context, sc Scenario, opts Options, say func(phase, msg string)) (o Outcome) {
	start := time.Now()
	o = Outcome{Scenario: sc.Name, Statuses: map[string]int{}}
	fail := func(format string, args ...any) { o.Failures = append(o.Failures, fmt.Sprintf(format, args...)) }
	defer func() { o.Elapsed = time.Since(start) }()
	t := opts.Target

	say("starting", sc.Summary)
	spec := sc.shopSpec()
	if len(sc.Settings) > 0 {
		say("starting", "settings "+strings.Join(sc.Settings, " "))
	}
	for _, svc := range slices.Sorted(maps.Keys(sc.ProcessSettings)) {
		say("starting", fmt.Sprintf("settings of %s alone: %s", svc, strings.Join(sc.ProcessSettings[svc], " ")))
	}
	unread := unreadSettings(sc.Settings)
	for _, kv := range unread {
		say("starting", fmt.Sprintf("%s is not a setting of its service (yet): the scenario runs without it", kv))
	}
	if sc.Failpoints != nil {
		spec.Failpoints = sc.Failpoints(opts.Rate)
		for svc, fp := range spec.Failpoints {
			say("starting", fmt.Sprintf("%s armed with CHAOS_FAILPOINTS=%s", svc, fp))
		}
	}
	eps, err := t.StartShop(ctx, spec)
	defer func() {
		if !o.Passed() {
			o.Logs = logTails(ctx, t, spec.Processes(), 40)
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := t.StopShop(sctx); err != nil {
			fail("stop the shop: %v", err)
		}
	}()
	if err != nil {
		fail("start the shop: %v", err)
		return o
	}
	ordersDB, err := pgxpool.New(ctx, eps.OrdersDB+"&pool_max_conns=2")
	if err != nil {
		fail("connect to the orders database: %v", err)
		return o
	}
	defer ordersDB.Close()
	warehouseDB, err := pgxpool.New(ctx, eps.WarehouseDB+"&pool_max_conns=2")
	if err != nil {
		fail("connect to the warehouse database: %v", err)
		return o
	}
	defer warehouseDB.Close()

	obs, err := startObserver(ctx, observerURLs(eps), eventsExchange, opts.Logger)
	if err != nil {
		fail("%v", err)
		return o
	}
	defer obs.stop()
	consumerMetrics := map[Service]string{}
	for _, s := range consumers {
		if u := eps.Metrics[s]; u != "" {
			consumerMetrics[s] = u
		}
	}
	scr := startScraper(ctx, consumerMetrics, 300*time.Millisecond)
	defer scr.close()

	load := max(opts.Load, sc.MinLoad)
	stock := initialStock(opts.Rate, load)
	if err := setStock(ctx, eps.StockURL, eps.AdminToken, stock); err != nil {
		fail("set the stock: %v", err)
		return o
	}
	probe, err := placeProbe(ctx, eps.OrdersURL, sc.Name)
	if err != nil {
		fail("place the probe order: %v", err)
		return o
	}

	e := &Env{Target: t, Endpoints: eps, Rate: opts.Rate, Load: load, Probe: probe, progress: say,
		processes: spec.Processes(), perMessageWarnings: sc.PerMessageWarnings}
	for _, kv := range unread {
		e.Saw("%s is not read by its service: the scenario ran on that setting's default", kv)
	}
	extend := sc.LoadAfterInject > 0 && sc.Inject != nil
	span := load.String()
	if extend {
		span = fmt.Sprintf("at least %s, and until %s after the faults", load, sc.LoadAfterInject)
	}
	say("load", fmt.Sprintf("%.0f orders/s for %s, retrying with the same key for up to %s, 10%% cancelled, 5%% sent twice",
		opts.Rate, span, opts.RetryFor))
	e.LoadStart = time.Now()
	var (
		wg        sync.WaitGroup
		result    loadgen.Result
		loadErr   error
		injectErr error
	)
	lcfg := loadgen.Config{
		OrdersURL: eps.OrdersURL, Rate: opts.Rate, Concurrency: 8, Duration: load,
		CancelFraction: 0.1, DuplicateFraction: 0.05, RetryFor: opts.RetryFor,
		KeyPrefix: sc.Name + "-", Seed: seed(sc.Name), Logger: opts.Logger,
	}
	if sc.RecordAnswers {
		e.Answers = &answerLog{}
		client := e.Answers.client(lcfg.Concurrency)
		defer client.CloseIdleConnections()
		lcfg.Client = client
	}
	if opts.Verbose {
		lcfg.Progress = prefixWriter{w: opts.Progress, prefix: "           " + fmt.Sprintf("%-22s %-15s ", sc.Name, "load")}
	}
	injected := make(chan struct{})
	var stoppedAt time.Time
	if extend {
		stop := make(chan struct{})
		lcfg.Duration, lcfg.Stop = 0, stop
		wg.Go(func() {
			defer close(stop)
			stoppedAt = loadEnd(ctx, e.LoadStart, load, load+maxLoadExtension, injected, sc.LoadAfterInject)
		})
	}
	wg.Go(func() { result, loadErr = loadgen.Run(ctx, lcfg) })
	if sc.Inject != nil {
		wg.Go(func() {
			defer close(injected)
			injectErr = sc.Inject(ctx, e)
		})
	}
	wg.Wait()
	if extend {
		load = stoppedAt.Sub(e.LoadStart)
		e.Load = load
	}
	if loadErr != nil {
		fail("load generator: %v", loadErr)
		return o
	}
	o.Placed, o.Acknowledged = result.Placed, len(result.Acknowledged)
	say("load", fmt.Sprintf("stopped: %d placed, %d acknowledged, %s, %s, %d cancelled; errors %s",
		result.Placed, len(result.Acknowledged), plural(result.Retries, "retry", "retries"), plural(result.Replays, "replay", "replays"),
		result.Cancelled, formatErrors(result.Errors)))
	if injectErr != nil {
		fail("fault not injected: %v", injectErr)
	} else if sc.Inject != nil && e.FaultAt().IsZero() {
		fail("fault not injected: the scenario recorded no fault")
	}

	acked := maps.Clone(result.Acknowledged)
	if acked == nil {
		acked = map[string]string{}
	}
	acked[probe.Key] = probe.ID
	want := verify.Expectation{Acknowledged: acked, InitialStock: stock, DeadOutboxRows: e.expectedDeadOutboxRows()}

	say("draining", fmt.Sprintf("until every invariant holds (at most %s)", opts.DrainTimeout))
	report, drainedAt, err := drain(ctx, ordersDB, warehouseDB, want, opts.DrainTimeout)
	if err != nil {
		fail("verify: %v", err)
		return o
	}
	if fa := e.FaultAt(); !fa.IsZero() && !drainedAt.IsZero() {
		o.Recovery = drainedAt.Sub(fa)
	}
	// The longest stall of completions, over the load: from its start (the first orders take
	// a moment too) to its end (the fault's effect after the load shows in the recovery).
	if times, err := completionTimes(ctx, ordersDB); err != nil {
		fail("read the completions: %v", err)
	} else {
		o.Stall, _ = longestStall(times, e.LoadStart, e.LoadStart.Add(load))
	}

	say("verifying", "observer, metrics, logs and both databases")
	if err := obs.drain(ctx); err != nil {
		fail("observer queue did not drain: %v", err)
	}
	e.Counts = obs.counts.Counts()
	if n := obs.redelivered.Load(); n > 0 {
		e.Saw("%s by the broker (its queue's leader changed), not publishes",
			plural(int(n), "delivery to the observer was a redelivery", "deliveries to the observer were redeliveries"))
	}
	scr.stop(ctx)
	e.Result.Retries, e.Result.Replays, e.Result.Duplicates, e.Result.Acknowledged = result.Retries, result.Replays, result.Duplicates, acked
	o.Statuses = report.ByStatus
	o.DuplicatesPublished = e.Counts.Duplicates
	o.DuplicatesAbsorbed, o.AbsorbedFrom = absorbed(ctx, t, scr)
	e.Audit, err = runAudit(ctx, ordersDB, warehouseDB, acked)
	if err != nil {
		fail("%v", err)
		return o
	}
	o.Lost = e.Audit.Missing + countAcked(report.Stuck, acked)
	o.DoubleApplied = e.Audit.DoubleApplied() + result.Errors["mismatch"]

	e.Saw("%s published, %d distinct, %s%s", plural(e.Counts.Total, "event", "events"), e.Counts.Distinct,
		plural(e.Counts.Duplicates, "repeat of an earlier one", "repeats of earlier ones"), sampleIDs(e.Counts.DuplicateIDs))
	e.Saw("%s absorbed by the inboxes (counted from %s)", plural(o.DuplicatesAbsorbed, "duplicate delivery", "duplicate deliveries"), o.AbsorbedFrom)
	e.Saw("final statuses %s; %s in all, %d acknowledged to their clients (probe included), %d unacknowledged (committed, but no client was told)",
		formatCounts(report.ByStatus), plural(report.Orders, "order", "orders"), len(acked), e.Audit.Orphans)
	for _, d := range t.Deaths() {
		e.Saw("%s incarnation %d %s, %.1fs into the load", d.Service, d.Incarnation, d.Cause(), d.At.Sub(e.LoadStart).Seconds())
	}
	if n := result.Errors["mismatch"]; n > 0 {
		fail("%s", plural(n, "replay differed from its first answer", "replays differed from their first answer"))
	}
	if !report.OK() {
		fail("invariants still broken %s after the load: %s", opts.DrainTimeout, abbreviateProblems(report.Problems))
	}
	if o.Lost > 0 {
		fail("%s lost (missing or never final)", plural(o.Lost, "acknowledged order", "acknowledged orders"))
	}
	for _, what := range slices.Sorted(maps.Keys(e.Audit.Twice)) {
		fail("applied twice: %d %s", e.Audit.Twice[what], what)
	}
	if o.Acknowledged == 0 {
		fail("no order was acknowledged: the load never reached the shop")
	}
	o.LogBurst = checkLogBursts(ctx, e, e.processes)
	e.mu.Lock()
	o.Failures = append(o.Failures, e.failures...)
	e.mu.Unlock()
	if sc.Check != nil {
		sc.Check(ctx, e, &o)
	}
	o.Injected, o.Seen = e.injected, e.seen
	return o
}

// drain polls the verifier until every invariant holds or timeout passes, and returns the
// last report and when it first held (zero if it never did).
func drain(ctx context.Context, orders, warehouse verify.DB, want verify.Expectation, timeout time.Duration) (verify.Report, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		report, err := verify.Run(ctx, orders, warehouse, want)
		if err == nil && report.OK() {
			return report, time.Now(), nil
		}
		if time.Now().After(deadline) {
			return report, time.Time{}, err
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return report, time.Time{}, ctx.Err()
		}
	}
}

// absorbed counts the duplicate deliveries the consumers' inboxes skipped: from
// inbox_duplicates_total, summed over the incarnations of each process, for a service that
// exports it, and otherwise from its log lines "duplicate message skipped" (which the
// consumer runner writes for each one).
func absorbed(ctx context.Context, t Target, scr *scraper) (int, string) {
	total := 0
	var from []string
	for _, svc := range consumers {
		if n, ok := scr.sum.ServiceTotal(string(svc)); ok {
			total += int(n)
			from = append(from, "metrics")
			continue
		}
		logs, err := t.Logs(ctx, svc)
		if err != nil {
			continue
		}
		total += countLines(logs, logDuplicateSkipped)
		from = append(from, "logs")
	}
	slices.Sort(from)
	return total, strings.Join(slices.Compact(from), "+")
}

func countAcked(ids []string, acked map[string]string) int {
	told := map[string]bool{}
	for _, id := range acked {
		told[id] = true
	}
	n := 0
	for _, id := range ids {
		if told[id] {
			n++
		}
	}
	return n
}

func abbreviateProblems(p []string) string {
	if len(p) > 8 {
		return strings.Join(p[:8], "; ") + fmt.Sprintf("; and %d more", len(p)-8)
	}
	return strings.Join(p, "; ")
}

func sampleIDs(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return " (e.g. " + strings.Join(ids, ", ") + ")"
}

func formatErrors(errs map[string]int) string {
	if len(errs) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, errs[k]))
	}
	return strings.Join(parts, ", ")
}

func seed(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// logTails returns the last n lines of each process's output.
func logTails(ctx context.Context, t Target, procs []Service, n int) map[Service]string {
	out := map[Service]string{}
	for _, s := range procs {
		logs, err := t.Logs(ctx, s)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		out[s] = strings.Join(lines, "\n")
	}
	return out
}

// setStock sets each SKU's available stock through PUT /stock/{sku}, an admin route: with
// the warehouse's admin token.
func setStock(ctx context.Context, stockURL, adminToken string, stock map[string]int64) error {
	for _, sku := range slices.Sorted(maps.Keys(stock)) {
		body, _ := json.Marshal(map[string]int64{"available": stock[sku]})
		status, resp, err := send(ctx, http.MethodPut, stockURL+"/stock/"+sku, "", body, "Authorization", "Bearer "+adminToken)
		if err != nil {
			return err
		}
		if status != http.StatusOK && status != http.StatusCreated {
			return fmt.Errorf("PUT /stock/%s: %d %s", sku, status, resp)
		}
	}
	return nil
}

// placeProbe places the runner's own order, whose id the scenarios can ask for.
func placeProbe(ctx context.Context, ordersURL, scenario string) (Probe, error) {
	p := Probe{
		Key:  scenario + "-probe",
		Body: []byte(`{"customer_id":"chaos-probe","items":[{"sku":"PEN-1","quantity":1}]}`),
	}
	status, resp, err := send(ctx, http.MethodPost, ordersURL+"/orders", p.Key, p.Body)
	if err != nil {
		return p, err
	}
	if status != http.StatusCreated {
		return p, fmt.Errorf("POST /orders: %d %s", status, resp)
	}
	var order struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(resp, &order); err != nil || order.ID == "" {
		return p, fmt.Errorf("POST /orders: no id in %s", resp)
	}
	p.ID = order.ID
	return p, nil
}

// send sends a JSON request with the Idempotency-Key key (none when empty) and the headers
// given as name, value pairs, and returns the status and the body of the answer.
func send(ctx context.Context, method, url, key string, body []byte, header ...string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if method == http.MethodPut {
		// Setting the stock before the load sets it whatever it is: PUT /stock/{sku} needs a
		// precondition, and "*" is the one that means "any current value".
		req.Header.Set("If-Match", "*")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// prefixWriter prefixes every line written to w.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	s := strings.ReplaceAll(string(b), "\r", "\n")
	var out strings.Builder
	for line := range strings.Lines(s) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		out.WriteString(p.prefix + strings.TrimRight(line, "\n") + "\n")
	}
	if _, err := io.WriteString(p.w, out.String()); err != nil {
		return 0, err
	}
	return len(b), nil
}

// maxLoadExtension bounds how long [Scenario].LoadAfterInject keeps a load going past its
// least duration, were Inject to hang.
const maxLoadExtension = 4 * time.Minute

// loadEnd waits until the load may stop: least after start, and after after injected is
// closed; most after start at the latest. It returns when it stopped waiting.
func loadEnd(ctx context.Context, start time.Time, least, most time.Duration, injected <-chan struct{}, after time.Duration) time.Time {
	limit := time.NewTimer(time.Until(start.Add(most)))
	defer limit.Stop()
	select {
	case <-injected:
	case <-limit.C:
		return time.Now()
	case <-ctx.Done():
		return time.Now()
	}
	end := time.Now().Add(after)
	if leastEnd := start.Add(least); end.Before(leastEnd) {
		end = leastEnd
	}
	wait := time.NewTimer(time.Until(end))
	defer wait.Stop()
	select {
	case <-wait.C:
	case <-limit.C:
	case <-ctx.Done():
	}
	return time.Now()
}

// shopSpec is the shop sc runs on.
func (sc Scenario) shopSpec() ShopSpec {
	return ShopSpec{Name: sc.Name, Settings: sc.Settings, Replicas: sc.Replicas, ProcessSettings: sc.ProcessSettings,
		OrdersStandby: sc.OrdersStandby, BrokerCluster: sc.BrokerCluster, TLS: sc.TLS, Network: sc.Network}
}
