package loadgen

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Config is one run of the load generator. The zero value of every field but OrdersURL is
// usable; [Run] fills the defaults and refuses a Config that makes no sense.
type Config struct {
	OrdersURL   string        // the orders API, e.g. http://127.0.0.1:8080 (required)
	Rate        float64       // orders per second, paced evenly (0: as fast as Concurrency allows)
	Concurrency int           // orders in flight at most (default 8)
	Duration    time.Duration // stop placing new orders after this long (0: no limit)
	Count       int           // stop after this many orders (0: no limit); with neither limit nor Stop, run until ctx is cancelled
	SKUs        []string      // default: BOOK-1 MUG-1 TEE-1 PEN-1 BAG-1
	MaxQuantity int           // per line, default 3

	// Stop, if set, stops placing new orders when it is closed, as the end of Duration does:
	// the orders in flight finish, retries included (for a run whose end is decided while it
	// runs).
	Stop <-chan struct{}

	UnknownSKUFraction float64 // share of orders with a SKU the shop does not sell (answered 422: counted as RejectedByAPI, not an error)
	CancelFraction     float64 // share of acknowledged orders cancelled right after (POST /orders/{id}/cancel)
	DuplicateFraction  float64 // share of orders deliberately sent twice with the same Idempotency-Key (the second must be a replay of the first)

	// RetryFor is how long an order (or a cancellation) is retried, with the SAME
	// Idempotency-Key and body, after a connection error, a timeout or a 5xx — a client whose
	// answer was lost. 0: no retries.
	RetryFor  time.Duration
	KeyPrefix string // Idempotency-Keys are KeyPrefix + sequence number (from 1); default "loadgen-" + 8 random hex digits + "-"
	Seed      uint64 // for reproducible SKU, quantity and fraction choices; 0: a random seed (printed in the summary)

	// Progress, if set, receives a live progress line: rewritten in place with \r when it is a
	// terminal, one line per second otherwise.
	Progress io.Writer
	Client   *http.Client // default: a 10s timeout and Concurrency keep-alive connections
	Logger   *slog.Logger // nil: discard
}

// defaultSKUs is the shop's catalogue, the default of [Config.SKUs].
var defaultSKUs = []string{"BOOK-1", "MUG-1", "TEE-1", "PEN-1", "BAG-1"}

const (
	defaultConcurrency = 8
	defaultMaxQuantity = 3
	defaultTimeout     = 10 * time.Second
	// maxQuantity is the largest quantity the orders API accepts on a line.
	maxQuantity = 1000
	// maxKeyPrefix leaves room for the sequence number and the X-Request-ID suffixes within
	// the API's limits (255 for the key, 128 for the request id).
	maxKeyPrefix = 96
	// unknownSKU is the SKU of UnknownSKUFraction orders; the shop does not sell it.
	unknownSKU = "LOADGEN-NO-SUCH-SKU"
)

// normalize returns cfg with its defaults filled, or every reason why it is not valid.
func (cfg Config) normalize() (Config, error) {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	if cfg.OrdersURL == "" {
		errs = append(errs, errors.New("OrdersURL is required"))
	} else if u, err := url.Parse(cfg.OrdersURL); err != nil {
		errs = append(errs, fmt.Errorf("OrdersURL: %w", err))
	} else {
		check((u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && u.Fragment == "",
			"OrdersURL must be an http:// or https:// URL with a host and no query, got %q", cfg.OrdersURL)
	}
	check(cfg.Rate >= 0 && !math.IsInf(cfg.Rate, 0), "Rate must be zero (no pacing) or a positive number of orders per second, got %v", cfg.Rate)
	check(cfg.Concurrency >= 0, "Concurrency must not be negative, got %d", cfg.Concurrency)
	check(cfg.Duration >= 0, "Duration must not be negative, got %s", cfg.Duration)
	check(cfg.Count >= 0, "Count must not be negative, got %d", cfg.Count)
	check(cfg.MaxQuantity >= 0 && cfg.MaxQuantity <= maxQuantity, "MaxQuantity must be 0 (default 3) to %d, got %d", maxQuantity, cfg.MaxQuantity)
	for _, f := range []struct {
		name string
		v    float64
	}{{"UnknownSKUFraction", cfg.UnknownSKUFraction}, {"CancelFraction", cfg.CancelFraction}, {"DuplicateFraction", cfg.DuplicateFraction}} {
		check(f.v >= 0 && f.v <= 1, "%s must be between 0 and 1, got %v", f.name, f.v) // false for NaN too
	}
	check(cfg.RetryFor >= 0, "RetryFor must not be negative, got %s", cfg.RetryFor)
	check(len(cfg.KeyPrefix) <= maxKeyPrefix, "KeyPrefix must be at most %d bytes, got %d", maxKeyPrefix, len(cfg.KeyPrefix))
	check(visibleASCII(cfg.KeyPrefix), "KeyPrefix must be visible ASCII characters, got %q", cfg.KeyPrefix)
	seen := map[string]bool{}
	for _, sku := range cfg.SKUs {
		check(sku != "" && len(sku) <= 64, "SKUs: %q is not a SKU (1 to 64 bytes)", sku)
		check(!seen[sku], "SKUs: %q is listed twice", sku)
		seen[sku] = true
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("loadgen: invalid config: %w", err)
	}

	cfg.OrdersURL = strings.TrimRight(cfg.OrdersURL, "/")
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaultConcurrency)
	cfg.MaxQuantity = cmp.Or(cfg.MaxQuantity, defaultMaxQuantity)
	if len(cfg.SKUs) == 0 {
		cfg.SKUs = defaultSKUs
	}
	cfg.SKUs = append([]string(nil), cfg.SKUs...) // the caller may reuse its slice
	if cfg.KeyPrefix == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.KeyPrefix = "loadgen-" + hex.EncodeToString(b) + "-"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

func visibleASCII(s string) bool {
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// newClient is the default HTTP client: a request timeout, and as many keep-alive
// connections as there are workers so that a steady load does not reconnect.
func newClient(concurrency int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(tr.MaxIdleConns, concurrency)
	tr.MaxIdleConnsPerHost = concurrency
	return &http.Client{Timeout: defaultTimeout, Transport: tr}
}
