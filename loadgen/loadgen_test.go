package loadgen_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/loadgen"
	"github.com/outboxshop/outboxshop/loadgen/internal/fakeshop"
)

// setup starts a fake orders API and returns it with a Config aimed at it: a fixed seed and
// key prefix, no duplicates, cancellations or unknown SKUs unless the test asks.
func setup(t *testing.T) (*fakeshop.Shop, loadgen.Config) {
	t.Helper()
	shop := fakeshop.New(t)
	return shop, loadgen.Config{OrdersURL: shop.URL, Seed: 1, KeyPrefix: "k-"}
}

// run runs cfg and fails the test if Run refuses it or takes longer than a minute.
func run(t *testing.T, cfg loadgen.Config) loadgen.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := loadgen.Run(ctx, cfg)
	require.NoError(t, err)
	return res
}

// posts returns the POST /orders requests the shop received, in order.
func posts(shop *fakeshop.Shop) []fakeshop.Request {
	var out []fakeshop.Request
	for _, r := range shop.Requests() {
		if r.Path == "/orders" {
			out = append(out, r)
		}
	}
	return out
}

func TestPacing(t *testing.T) {
	t.Parallel()

	t.Run("CountAtHighRate", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Rate, cfg.Count = 500, 50
		res := run(t, cfg)
		require.Equal(t, 50, res.Placed)
		require.Len(t, res.Acknowledged, 50)
		require.Empty(t, res.Errors)
		require.Len(t, posts(shop), 50, "one POST per order: no duplicates, no retries")
		require.Len(t, shop.Orders(), 50)
		for i := 1; i <= 50; i++ {
			require.Contains(t, res.Acknowledged, fmt.Sprintf("k-%d", i))
		}
		// The 50th order is due 49/500 s after the first: pacing held them back.
		require.GreaterOrEqual(t, res.Elapsed, 98*time.Millisecond)
	})

	t.Run("OrdersInAWindow", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Rate, cfg.Duration = 100, 500*time.Millisecond
		res := run(t, cfg)
		// Due at 0, 10, …, 490 ms: 50 orders, never more. Fewer only when the machine stalls the
		// run for over 100ms (the backlog allowed), as an overloaded CI machine may.
		require.LessOrEqual(t, res.Placed, 50)
		require.GreaterOrEqual(t, res.Placed, 35)
		require.Len(t, posts(shop), res.Placed)
		require.Empty(t, res.Errors)
	})

	t.Run("KeepsUpAtALowRate", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Rate, cfg.Count = 20, 5
		res := run(t, cfg)
		require.Equal(t, 5, res.Placed)
		require.Len(t, shop.Orders(), 5)
		require.GreaterOrEqual(t, res.Elapsed, 200*time.Millisecond, "the 5th order is due 4/20 s after the first")
		require.NotContains(t, res.Summary(), "FELL BEHIND")
	})

	t.Run("Unpaced", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Count, cfg.Concurrency = 30, 4
		res := run(t, cfg)
		require.Equal(t, 30, res.Placed)
		require.Len(t, shop.Orders(), 30)
		require.NotContains(t, res.Summary(), "FELL BEHIND")
	})

	t.Run("FallsBehindWhenSaturated", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			time.Sleep(50 * time.Millisecond) // a slow shop: 2 workers place at most 40 orders/s
			return false
		})
		cfg.Rate, cfg.Concurrency, cfg.Duration = 400, 2, 400*time.Millisecond
		res := run(t, cfg)
		require.Less(t, res.Placed, 80, "2 workers cannot keep 400/s")
		require.Empty(t, res.Errors)
		require.Contains(t, res.Summary(), "FELL BEHIND")
		require.Contains(t, res.Summary(), "all 2 workers were busy")
	})
}

func TestRetries(t *testing.T) {
	t.Parallel()

	t.Run("SameKeyAfter503", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			if attempt <= 2 {
				fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
				return true
			}
			return false
		})
		cfg.Count, cfg.RetryFor = 1, 10*time.Second
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.Equal(t, 2, res.Retries)
		require.Len(t, res.Acknowledged, 1)
		reqs := posts(shop)
		require.Len(t, reqs, 3)
		for _, r := range reqs {
			require.Equal(t, "k-1", r.Key)
			require.Equal(t, reqs[0].Body, r.Body, "a retry resends the same request")
		}
		require.Equal(t, []string{"k-1.1", "k-1.2", "k-1.3"}, []string{reqs[0].RequestID, reqs[1].RequestID, reqs[2].RequestID})
	})

	t.Run("SameKeyAfterDroppedConnection", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			if attempt == 1 {
				fakeshop.Hangup(w)
				return true
			}
			return false
		})
		// New connections only: on a reused keep-alive connection Go's transport itself resends
		// a request that carries an Idempotency-Key, and loadgen would not see the failure.
		cfg.Client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		cfg.Count, cfg.Concurrency, cfg.RetryFor = 3, 1, 10*time.Second
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.Equal(t, 3, res.Retries)
		require.Len(t, res.Acknowledged, 3)
		reqs := posts(shop)
		require.Len(t, reqs, 6)
		for i := 0; i < 6; i += 2 {
			require.Equal(t, reqs[i].Key, reqs[i+1].Key)
			require.Equal(t, reqs[i].Body, reqs[i+1].Body)
		}
		require.Len(t, shop.Orders(), 3)
	})

	t.Run("LostAnswerIsReplayed", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetDropAnswer(func(key string, attempt int) bool { return attempt == 1 }) // committed, answer lost
		cfg.Client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		cfg.Count, cfg.RetryFor = 1, 10*time.Second
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.Equal(t, 1, res.Retries)
		require.Equal(t, 1, res.Replays, "the retry finds the order the lost answer created")
		orders := shop.Orders()
		require.Len(t, orders, 1)
		for id := range orders {
			require.Equal(t, map[string]string{"k-1": id}, res.Acknowledged)
		}
	})

	t.Run("GivesUpAfterRetryFor", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
			return true
		})
		cfg.Count, cfg.RetryFor = 1, 300*time.Millisecond
		res := run(t, cfg)
		require.Equal(t, map[string]int{"http_5xx": 1}, res.Errors)
		require.Positive(t, res.Retries)
		require.Len(t, posts(shop), res.Retries+1)
		require.Empty(t, res.Acknowledged)
	})

	t.Run("NoRetriesWithoutRetryFor", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
			return true
		})
		cfg.Count = 2
		res := run(t, cfg)
		require.Equal(t, map[string]int{"http_5xx": 2}, res.Errors)
		require.Zero(t, res.Retries)
		require.Len(t, posts(shop), 2)
	})
}

func TestDuplicates(t *testing.T) {
	t.Parallel()

	t.Run("Replayed", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Count, cfg.Rate, cfg.DuplicateFraction = 10, 200, 1
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.Equal(t, 10, res.Duplicates)
		require.Equal(t, 10, res.Replays)
		require.Len(t, shop.Orders(), 10, "a duplicate creates nothing")
		byKey := map[string][]fakeshop.Request{}
		for _, r := range posts(shop) {
			byKey[r.Key] = append(byKey[r.Key], r)
		}
		require.Len(t, byKey, 10)
		for key, reqs := range byKey {
			require.Len(t, reqs, 2, key)
			require.Equal(t, reqs[0].Body, reqs[1].Body, key)
		}
	})

	t.Run("SomeOrders", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Count, cfg.DuplicateFraction = 200, 0.25
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.InDelta(t, 50, res.Duplicates, 25)
		require.Equal(t, res.Duplicates, res.Replays)
		require.Len(t, posts(shop), 200+res.Duplicates)
	})

	t.Run("MismatchIsAnError", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetReplay(func(w http.ResponseWriter, stored fakeshop.Answer) { // a shop that creates a second order
			w.Header().Set("Location", stored.Location+"0")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"another"}`))
		})
		cfg.Count, cfg.DuplicateFraction = 3, 1
		res := run(t, cfg)
		require.Equal(t, map[string]int{"mismatch": 3}, res.Errors)
		require.Zero(t, res.Replays)
		require.Contains(t, res.Summary(), "MISMATCH")
		require.Contains(t, res.Summary(), "not marked Idempotent-Replayed")
	})
}

func TestCancellations(t *testing.T) {
	t.Parallel()
	shop, cfg := setup(t)
	var n atomic.Int64
	shop.SetCancelStatus(func(id string) int {
		if n.Add(1)%2 == 0 {
			return http.StatusConflict // the warehouse rejected it first
		}
		return http.StatusOK
	})
	cfg.Count, cfg.CancelFraction = 10, 1
	res := run(t, cfg)
	require.Empty(t, res.Errors, "409 is expected")
	require.Equal(t, 5, res.Cancelled)
	cancels := shop.Cancels()
	require.Len(t, cancels, 10)
	for _, id := range res.Acknowledged {
		require.Equal(t, 1, cancels[id], id)
	}
	require.Contains(t, res.Summary(), "5 (and 5 already rejected by the warehouse: 409, expected)")

	t.Run("Fraction", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		cfg.Count, cfg.CancelFraction = 200, 0.1
		res := run(t, cfg)
		require.Empty(t, res.Errors)
		require.InDelta(t, 20, res.Cancelled, 14)
		require.Len(t, shop.Cancels(), res.Cancelled)
	})
}

func TestErrorKinds(t *testing.T) {
	t.Parallel()
	answer := func(status int, body string) func(http.ResponseWriter, *http.Request, int) bool {
		return func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
			return true
		}
	}
	for _, tc := range []struct {
		name     string
		before   func(http.ResponseWriter, *http.Request, int) bool
		unknown  float64
		timeout  time.Duration
		want     map[string]int
		rejected int
	}{
		{name: "400", before: answer(http.StatusBadRequest, `{"type":"urn:outboxshop:problem:invalid-header"}`), want: map[string]int{"http_4xx": 2}},
		{name: "422ForAKnownSKU", before: answer(http.StatusUnprocessableEntity, `{"type":"urn:outboxshop:problem:validation"}`), want: map[string]int{"http_4xx": 2}},
		{name: "500", before: answer(http.StatusInternalServerError, `{}`), want: map[string]int{"http_5xx": 2}},
		{name: "200NotCreated", before: answer(http.StatusOK, `{"id":"x"}`), want: map[string]int{"unexpected": 2}},
		{name: "CreatedWithoutID", before: answer(http.StatusCreated, `{}`), want: map[string]int{"unexpected": 2}},
		{name: "UnknownSKURejected", unknown: 1, want: map[string]int{}, rejected: 2},
		{name: "UnknownSKUAccepted", before: answer(http.StatusCreated, `{"id":"x"}`), unknown: 1, want: map[string]int{"unexpected": 2}},
		{name: "UnknownSKUKeyReuse", before: answer(http.StatusUnprocessableEntity, `{"type":"urn:outboxshop:problem:idempotency-key-reuse"}`), unknown: 1, want: map[string]int{"http_4xx": 2}},
		{
			name: "Timeout", timeout: 100 * time.Millisecond, want: map[string]int{"timeout": 2},
			before: func(w http.ResponseWriter, r *http.Request, attempt int) bool {
				<-r.Context().Done() // until the client gives up
				return true
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shop, cfg := setup(t)
			shop.SetBefore(tc.before)
			cfg.Count, cfg.UnknownSKUFraction = 2, tc.unknown
			if tc.timeout > 0 {
				cfg.Client = &http.Client{Timeout: tc.timeout}
			}
			res := run(t, cfg)
			require.Equal(t, tc.want, res.Errors)
			require.Equal(t, tc.rejected, res.RejectedByAPI)
			require.Equal(t, 2, res.Placed)
			require.Zero(t, res.Retries)
			if len(tc.want) > 0 {
				require.Empty(t, res.Acknowledged)
				require.Contains(t, res.Summary(), "e.g. POST /orders (key k-")
			}
		})
	}

	t.Run("ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close() // nothing listens there any more
		res := run(t, loadgen.Config{OrdersURL: srv.URL, Count: 3, RetryFor: 200 * time.Millisecond})
		require.Equal(t, map[string]int{"connection": 3}, res.Errors)
		require.Positive(t, res.Retries, "connection errors are retried")
	})

	t.Run("CancelNotFound", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		shop.SetCancelStatus(func(string) int { return http.StatusNotFound })
		cfg.Count, cfg.CancelFraction = 2, 1
		res := run(t, cfg)
		require.Equal(t, map[string]int{"http_4xx": 2}, res.Errors)
		require.Len(t, res.Acknowledged, 2)
		require.Contains(t, res.Summary(), "/cancel (key k-")
	})
}

func TestStop(t *testing.T) {
	t.Parallel()

	t.Run("ContextCancelled", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		tenth := make(chan struct{})
		var once sync.Once
		var seen atomic.Int64
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			if seen.Add(1) >= 10 {
				once.Do(func() { close(tenth) })
			}
			return false
		})
		cfg.Rate = 200 // no Count, no Duration: until cancelled
		res := runUntilCancelled(t, cfg, tenth, "Run did not return after its context was cancelled")
		require.GreaterOrEqual(t, res.Placed, 10)
		require.Empty(t, res.Errors, "the orders in flight finish")
		require.Len(t, res.Acknowledged, res.Placed)
		require.Len(t, shop.Orders(), res.Placed)
	})

	t.Run("StopClosed", func(t *testing.T) {
		// Closing Stop ends the placing as Duration's end does: an order retrying then is
		// not abandoned, it finishes.
		t.Parallel()
		shop, cfg := setup(t)
		stop := make(chan struct{})
		var once sync.Once
		var seen atomic.Int64
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			if r.URL.Path != "/orders" || attempt > 1 || seen.Add(1) < 10 {
				return false
			}
			once.Do(func() { close(stop) })
			fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
			return true
		})
		cfg.Rate, cfg.Stop, cfg.RetryFor = 200, stop, time.Minute // no Count, no Duration
		res := run(t, cfg)
		require.GreaterOrEqual(t, res.Placed, 10)
		require.Less(t, res.Placed, 100, "placing went on after Stop was closed")
		require.Empty(t, res.Errors, "the orders in flight, the retrying ones too, finish")
		require.Len(t, res.Acknowledged, res.Placed)
		require.Positive(t, res.Retries)
	})

	t.Run("GraceRunsOut", func(t *testing.T) {
		t.Parallel()
		shop, cfg := setup(t)
		retrying := make(chan struct{})
		shop.SetBefore(func(w http.ResponseWriter, r *http.Request, attempt int) bool {
			if attempt == 3 {
				close(retrying)
			}
			fakeshop.Problem(w, http.StatusServiceUnavailable, "unavailable", "database down")
			return true
		})
		cfg.Count, cfg.RetryFor = 1, time.Hour
		cfg.Client = &http.Client{Timeout: 200 * time.Millisecond} // the grace after a stop
		res := runUntilCancelled(t, cfg, retrying, "Run did not abandon the retrying order after the grace period")
		require.Equal(t, map[string]int{"interrupted": 1}, res.Errors)
		require.Equal(t, 1, res.Placed)
	})
}

func TestSeedIsReproducible(t *testing.T) {
	t.Parallel()
	bodies := func(seed uint64) map[string]string {
		shop, cfg := setup(t)
		cfg.Seed, cfg.Count, cfg.Concurrency = seed, 40, 4
		cfg.UnknownSKUFraction, cfg.DuplicateFraction, cfg.CancelFraction = 0.2, 0.2, 0.2
		run(t, cfg)
		out := map[string]string{}
		for _, r := range shop.Requests() {
			out[r.RequestID] = string(r.Body) // order ids differ with the scheduling; request ids do not
		}
		return out
	}
	a := bodies(42)
	require.Equal(t, a, bodies(42), "the same seed makes the same requests, whatever the scheduling")
	require.NotEqual(t, a, bodies(43))
	require.Contains(t, a, "k-1.1")
	require.Contains(t, a["k-1.1"], `"items":[{"sku":`)
}

func TestProgress(t *testing.T) {
	t.Parallel()
	_, cfg := setup(t)
	var out bytes.Buffer // not a terminal: whole lines
	cfg.Count, cfg.Progress = 5, &out
	run(t, cfg)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	require.Regexp(t, `^loadgen +\d+\.\ds  placed 5  acked 5  rejected 0  errors 0  rate [\d.]+/s  p99 \S+$`, last)
	require.NotContains(t, out.String(), "\r")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	shop := fakeshop.New(t)
	for _, tc := range []struct {
		name   string
		modify func(*loadgen.Config)
		want   string
	}{
		{"NoURL", func(c *loadgen.Config) { c.OrdersURL = "" }, "OrdersURL is required"},
		{"NotHTTP", func(c *loadgen.Config) { c.OrdersURL = "ftp://shop" }, "OrdersURL must be an http://"},
		{"NoHost", func(c *loadgen.Config) { c.OrdersURL = "http://" }, "OrdersURL must be"},
		{"NegativeRate", func(c *loadgen.Config) { c.Rate = -1 }, "Rate must be zero"},
		{"NaNRate", func(c *loadgen.Config) { c.Rate = math.NaN() }, "Rate must be zero"},
		{"InfiniteRate", func(c *loadgen.Config) { c.Rate = math.Inf(1) }, "Rate must be zero"},
		{"NegativeConcurrency", func(c *loadgen.Config) { c.Concurrency = -1 }, "Concurrency must not be negative"},
		{"NegativeDuration", func(c *loadgen.Config) { c.Duration = -time.Second }, "Duration must not be negative"},
		{"NegativeCount", func(c *loadgen.Config) { c.Count = -1 }, "Count must not be negative"},
		{"NegativeRetryFor", func(c *loadgen.Config) { c.RetryFor = -time.Second }, "RetryFor must not be negative"},
		{"QuantityTooLarge", func(c *loadgen.Config) { c.MaxQuantity = 1001 }, "MaxQuantity must be"},
		{"CancelAboveOne", func(c *loadgen.Config) { c.CancelFraction = 1.5 }, "CancelFraction must be between 0 and 1, got 1.5"},
		{"DuplicateNegative", func(c *loadgen.Config) { c.DuplicateFraction = -0.1 }, "DuplicateFraction must be between 0 and 1"},
		{"UnknownNaN", func(c *loadgen.Config) { c.UnknownSKUFraction = math.NaN() }, "UnknownSKUFraction must be between 0 and 1"},
		{"EmptySKU", func(c *loadgen.Config) { c.SKUs = []string{"BOOK-1", ""} }, `SKUs: "" is not a SKU`},
		{"SKUTwice", func(c *loadgen.Config) { c.SKUs = []string{"BOOK-1", "BOOK-1"} }, `"BOOK-1" is listed twice`},
		{"KeyPrefixSpace", func(c *loadgen.Config) { c.KeyPrefix = "my key" }, "KeyPrefix must be visible ASCII"},
		{"KeyPrefixLong", func(c *loadgen.Config) { c.KeyPrefix = strings.Repeat("k", 97) }, "KeyPrefix must be at most 96 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := loadgen.Config{OrdersURL: shop.URL, Count: 1}
			tc.modify(&cfg)
			_, err := loadgen.Run(context.Background(), cfg)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "loadgen: invalid config")
		})
	}
	t.Run("EveryProblemAtOnce", func(t *testing.T) {
		t.Parallel()
		_, err := loadgen.Run(context.Background(), loadgen.Config{OrdersURL: shop.URL, Rate: -1, CancelFraction: 2})
		require.ErrorContains(t, err, "Rate")
		require.ErrorContains(t, err, "CancelFraction")
	})
	t.Cleanup(func() { require.Empty(t, shop.Requests(), "a bad config sends nothing") })
}

// runUntilCancelled runs loadgen.Run in the background, cancels its context once cue is
// closed, and returns its result; it fails the test with stuck if Run does not return within
// 10 s of the cancellation. An error from Run comes back as the result's only error.
func runUntilCancelled(t *testing.T, cfg loadgen.Config, cue <-chan struct{}, stuck string) loadgen.Result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan loadgen.Result, 1)
	go func() {
		res, err := loadgen.Run(ctx, cfg)
		if err != nil {
			res.Errors = map[string]int{err.Error(): 1}
		}
		results <- res
	}()
	<-cue
	cancel()
	select {
	case res := <-results:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
		return loadgen.Result{}
	}
}
