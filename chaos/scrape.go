package chaos

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Metric names the runner reads from the services' /metrics.
const (
	metricDuplicates = "inbox_duplicates_total"
	metricStartTime  = "process_start_time_seconds"
)

// sumMetric adds up every sample of the metric family name in a Prometheus text exposition.
// found is false when the exposition has no sample of it.
func sumMetric(exposition, name string) (sum float64, found bool) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		case strings.HasPrefix(rest, " "), strings.HasPrefix(rest, "\t"):
		default:
			continue // another metric whose name starts with name
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

// incarnationSum adds up a counter across process restarts: a restarted process counts from
// zero again, so the last value seen of each incarnation is kept, the incarnations told apart
// by their process_start_time_seconds, and the sum is their total. Safe for concurrent use.
type incarnationSum struct {
	mu   sync.Mutex
	last map[string]map[float64]float64 // service → start time → last value
}

// Observe records value as the latest of service's incarnation started at start.
func (s *incarnationSum) Observe(service string, start, value float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[string]map[float64]float64{}
	}
	if s.last[service] == nil {
		s.last[service] = map[float64]float64{}
	}
	if value >= s.last[service][start] {
		s.last[service][start] = value
	}
}

// Total is the sum over every incarnation of every service; seen reports whether anything
// was observed.
func (s *incarnationSum) Total() (total float64, seen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byStart := range s.last {
		for _, v := range byStart {
			total += v
			seen = true
		}
	}
	return total, seen
}

// ServiceTotal is the sum over the incarnations of one service; seen reports whether any of
// them exported the counter.
func (s *incarnationSum) ServiceTotal(service string) (total float64, seen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.last[service] {
		total += v
		seen = true
	}
	return total, seen
}

// Incarnations is how many incarnations of service were seen.
func (s *incarnationSum) Incarnations(service string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.last[service])
}

// scraper reads inbox_duplicates_total from the consumers' /metrics every interval, so that
// the last value of a process is known when a crash point kills it.
type scraper struct {
	urls   map[Service]string
	sum    incarnationSum
	client *http.Client
	cancel context.CancelFunc
	done   chan struct{}
}

func startScraper(ctx context.Context, urls map[Service]string, interval time.Duration) *scraper {
	s := &scraper{urls: urls, client: &http.Client{Timeout: time.Second}, done: make(chan struct{})}
	ctx, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.scrapeAll(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *scraper) scrapeAll(ctx context.Context) {
	for svc, url := range s.urls {
		s.scrape(ctx, svc, url)
	}
}

func (s *scraper) scrape(ctx context.Context, svc Service, url string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return // down: its last value is kept
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return
	}
	start, ok := sumMetric(string(b), metricStartTime)
	if !ok {
		return
	}
	if v, ok := sumMetric(string(b), metricDuplicates); ok {
		s.sum.Observe(string(svc), start, v)
	}
}

// close stops the scraping and waits for it.
func (s *scraper) close() {
	s.cancel()
	<-s.done
}

// stop stops the scraping and scrapes a last time.
func (s *scraper) stop(ctx context.Context) {
	s.close()
	s.scrapeAll(ctx)
}
