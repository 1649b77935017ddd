// Package healthcheck is a container health probe for images without a shell or curl, such
// as the distroless images of outboxshop: it GETs one URL and succeeds on a 2xx answer.
//
// The compose file runs it as
//
//	healthcheck: {test: ["CMD", "/healthcheck", "http://127.0.0.1:8080/readyz"]}
//
// and Docker reads the exit code: 0 healthy, 1 unhealthy. What went wrong is printed on
// stderr, which `docker inspect` shows in the container's health log.
package healthcheck

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// DefaultTimeout bounds one probe when -timeout is not given; it stays below compose's
// healthcheck timeout so that the probe reports its own reason instead of being killed.
const DefaultTimeout = 3 * time.Second

// Check GETs rawURL with client and returns nil when the answer is 2xx. The body is read (up
// to 4 KiB) and shown in the error of any other status.
func Check(ctx context.Context, client *http.Client, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", rawURL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("User-Agent", "outboxshop-healthcheck")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, body)
	}
	return nil
}

// Main runs the command line `healthcheck [-timeout 3s] URL` and returns the exit code: 0 when
// the URL answers 2xx, 1 when it does not, 2 for bad usage.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: healthcheck [-timeout 3s] URL\n\nexits 0 when a GET of URL answers 2xx, 1 otherwise")
		fs.PrintDefaults()
	}
	timeout := fs.Duration("timeout", DefaultTimeout, "bound on the whole request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 || *timeout <= 0 {
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// No proxy from the environment: the probe targets the container itself.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	if err := Check(ctx, client, fs.Arg(0)); err != nil {
		fmt.Fprintln(stderr, "unhealthy:", err)
		return 1
	}
	return 0
}
