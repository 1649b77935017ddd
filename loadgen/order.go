package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Headers of the orders API's idempotency protocol (services/orders/README.md).
const (
	headerIdempotencyKey     = "Idempotency-Key"
	headerIdempotentReplayed = "Idempotent-Replayed"
	problemKeyReuse          = "urn:outboxshop:problem:idempotency-key-reuse"
)

// Retry pacing: exponential from retryFirst to retryMax; a Retry-After is honoured up to
// retryAfterMax.
const (
	retryFirst    = 50 * time.Millisecond
	retryMax      = 2 * time.Second
	retryAfterMax = 10 * time.Second
	maxBody       = 1 << 20
)

type orderLine struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

type orderRequest struct {
	CustomerID string      `json:"customer_id"`
	Items      []orderLine `json:"items"`
}

// plan is everything decided about order n before it is sent: the same Seed and n give the
// same plan, whichever worker runs it and whenever.
type plan struct {
	n          int
	key        string
	body       []byte
	unknownSKU bool
	duplicate  bool
	cancel     bool
}

func (r *runner) plan(n int) plan {
	cfg := r.cfg
	rng := rand.New(rand.NewPCG(r.seed, uint64(n)))
	p := plan{
		n:          n,
		key:        cfg.KeyPrefix + strconv.Itoa(n),
		unknownSKU: rng.Float64() < cfg.UnknownSKUFraction,
		duplicate:  rng.Float64() < cfg.DuplicateFraction,
		cancel:     rng.Float64() < cfg.CancelFraction,
	}
	req := orderRequest{CustomerID: fmt.Sprintf("loadgen-customer-%d", 1+rng.IntN(100))}
	for _, i := range rng.Perm(len(cfg.SKUs))[:1+rng.IntN(min(3, len(cfg.SKUs)))] {
		req.Items = append(req.Items, orderLine{SKU: cfg.SKUs[i], Quantity: 1 + rng.IntN(cfg.MaxQuantity)})
	}
	if p.unknownSKU {
		req.Items[rng.IntN(len(req.Items))].SKU = unknownSKU
	}
	p.body, _ = json.Marshal(req) // plain strings and ints: cannot fail
	return p
}

// answer is one HTTP exchange that got a response.
type answer struct {
	status   int
	body     []byte
	location string
	replayed bool
	latency  time.Duration
	retryIn  time.Duration // from Retry-After
}

// problemType is the type of a problem+json answer, "" for anything else.
func (a answer) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Type
}

// describe is a short account of an answer for the summary and the logs.
func (a answer) describe() string {
	s := strconv.Itoa(a.status)
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	if json.Unmarshal(a.body, &p) == nil && (p.Type != "" || p.Detail != "") {
		s += " " + p.Type
		if p.Detail != "" {
			s += ": " + p.Detail
		}
	}
	return s
}

// order places order n, and then its duplicate and its cancellation if the plan says so.
func (r *runner) order(ctx context.Context, n int) {
	p := r.plan(n)
	what := "POST /orders (key " + p.key + ")"
	first, err := r.send(ctx, http.MethodPost, "/orders", p.key, p.body, p.key)
	if err != nil {
		r.fail(ctx, r.transportKind(ctx, err), what, err.Error())
		return
	}
	switch {
	case first.status == http.StatusCreated && p.unknownSKU:
		r.fail(ctx, kindUnexpected, what, "an order with an unknown SKU was accepted: 201")
		return
	case first.status == http.StatusCreated:
	case first.status == http.StatusUnprocessableEntity && p.unknownSKU && first.problemType() != problemKeyReuse:
		r.mu.Lock()
		r.res.RejectedByAPI++
		r.mu.Unlock()
		return
	default:
		r.fail(ctx, statusKind(first.status), what, first.describe())
		return
	}
	var created struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(first.body, &created) != nil || created.ID == "" {
		r.fail(ctx, kindUnexpected, what, "201 without an order id")
		return
	}
	r.mu.Lock()
	r.res.Acknowledged[p.key] = created.ID
	r.hist.record(first.latency)
	r.mu.Unlock()

	if p.duplicate {
		r.duplicate(ctx, p, first)
	}
	if p.cancel {
		r.cancelOrder(ctx, p, created.ID)
	}
}

// duplicate sends order p again with its key, and checks that the answer is a replay of the
// first one: same status, same body, same Location, marked Idempotent-Replayed.
func (r *runner) duplicate(ctx context.Context, p plan, first answer) {
	what := "duplicate POST /orders (key " + p.key + ")"
	r.mu.Lock()
	r.res.Duplicates++
	r.mu.Unlock()
	again, err := r.send(ctx, http.MethodPost, "/orders", p.key, p.body, p.key+".dup")
	if err != nil {
		r.fail(ctx, r.transportKind(ctx, err), what, err.Error())
		return
	}
	if again.status >= 500 {
		r.fail(ctx, kindHTTP5xx, what, again.describe())
		return
	}
	var diffs []string
	if again.status != first.status {
		diffs = append(diffs, fmt.Sprintf("status %d, first %d", again.status, first.status))
	}
	if !again.replayed {
		diffs = append(diffs, "not marked "+headerIdempotentReplayed)
	}
	if again.location != first.location {
		diffs = append(diffs, fmt.Sprintf("Location %q, first %q", again.location, first.location))
	}
	if !bytes.Equal(again.body, first.body) {
		diffs = append(diffs, "another body")
	}
	if len(diffs) > 0 {
		r.fail(ctx, kindMismatch, what, fmt.Sprint(diffs))
		return
	}
	r.mu.Lock()
	r.hist.record(again.latency)
	r.mu.Unlock()
}

// cancelOrder cancels an acknowledged order. 409 is expected: the warehouse rejected it first.
func (r *runner) cancelOrder(ctx context.Context, p plan, id string) {
	path := "/orders/" + url.PathEscape(id) + "/cancel"
	what := "POST " + path + " (key " + p.key + ")"
	a, err := r.send(ctx, http.MethodPost, path, "", nil, p.key+".cancel")
	switch {
	case err != nil:
		r.fail(ctx, r.transportKind(ctx, err), what, err.Error())
		return
	case a.status == http.StatusOK:
		r.mu.Lock()
		r.res.Cancelled++
		r.mu.Unlock()
	case a.status == http.StatusConflict:
		r.mu.Lock()
		r.res.cancelConflicts++
		r.mu.Unlock()
	default:
		r.fail(ctx, statusKind(a.status), what, a.describe())
	}
}

// send makes one request, and retries it — the same key, the same body — while it fails with a
// connection error, a timeout, a 5xx or a 429, for up to RetryFor. It returns the last answer,
// or the last transport error. Attempt i carries the X-Request-ID rid.i, which the shop uses
// as the correlation id of the events it writes.
func (r *runner) send(ctx context.Context, method, path, key string, body []byte, rid string) (answer, error) {
	deadline := time.Now().Add(r.cfg.RetryFor)
	backoff := retryFirst
	for attempt := 1; ; attempt++ {
		a, err := r.exchange(ctx, method, path, key, body, rid+"."+strconv.Itoa(attempt))
		if err == nil && a.replayed {
			r.mu.Lock()
			r.res.Replays++
			r.mu.Unlock()
		}
		retryable := (err != nil && ctx.Err() == nil) || (err == nil && (a.status >= 500 || a.status == http.StatusTooManyRequests))
		if !retryable || r.cfg.RetryFor <= 0 {
			return a, err
		}
		wait := backoff
		if err == nil {
			wait = max(wait, min(a.retryIn, retryAfterMax))
		}
		wait += rand.N(wait / 5) // jitter, so that the workers do not retry in step
		if time.Now().Add(wait).After(deadline) {
			return a, err
		}
		reason := ""
		if err != nil {
			reason = err.Error()
		} else {
			reason = a.describe()
		}
		r.log.DebugContext(ctx, "retrying", "method", method, "path", path, "idempotency_key", key,
			"attempt", attempt, "in", wait, "reason", reason)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return answer{}, ctx.Err()
		}
		r.mu.Lock()
		r.res.Retries++
		r.mu.Unlock()
		backoff = min(backoff*2, retryMax)
	}
}

// exchange is one HTTP request and its whole answer.
func (r *runner) exchange(ctx context.Context, method, path, key string, body []byte, requestID string) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body) // sets GetBody, so the transport may resend it too
	}
	req, err := http.NewRequestWithContext(ctx, method, r.cfg.OrdersURL+path, rd)
	if err != nil {
		return answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(headerIdempotencyKey, key)
	}
	if len(requestID) <= 128 {
		req.Header.Set("X-Request-ID", requestID)
	}
	req.Header.Set("User-Agent", "outboxshop-loadgen")
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return answer{}, fmt.Errorf("read the answer of %s %s: %w", method, path, err)
	}
	a := answer{
		status:   resp.StatusCode,
		body:     raw,
		location: resp.Header.Get("Location"),
		replayed: resp.Header.Get(headerIdempotentReplayed) == "true",
		latency:  time.Since(start),
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		a.retryIn = time.Duration(s) * time.Second
	}
	return a, nil
}

// transportKind classifies a request that got no answer.
func (r *runner) transportKind(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case ctx.Err() != nil:
		return kindInterrupted
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	default:
		return kindConnection
	}
}

// statusKind classifies an answer the request did not expect.
func statusKind(status int) string {
	switch {
	case status >= 500:
		return kindHTTP5xx
	case status >= 400:
		return kindHTTP4xx
	default:
		return kindUnexpected
	}
}

// fail counts an error of kind; the first of each kind is logged as a warning and kept as the
// summary's example, the others are logged at debug level.
func (r *runner) fail(ctx context.Context, kind, what, detail string) {
	r.mu.Lock()
	r.res.Errors[kind]++
	first := r.res.Errors[kind] == 1
	if first {
		r.res.examples[kind] = what + ": " + detail
	}
	r.mu.Unlock()
	if first {
		r.log.WarnContext(ctx, "request failed: "+kind, "request", what, "error", detail)
	} else {
		r.log.DebugContext(ctx, "request failed: "+kind, "request", what, "error", detail)
	}
}
