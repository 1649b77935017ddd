package loadgen

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progressEvery is how often the progress line is written.
const progressEvery = time.Second

// progress writes the live progress line: rewritten in place on a terminal, one line per
// second otherwise (a log file, docker compose logs).
type progress struct {
	r    *runner
	w    io.Writer
	tty  bool
	quit chan struct{}
	done chan struct{}

	lastAt      time.Time
	lastPlaced  int
	lastSkipped int
}

func startProgress(r *runner, w io.Writer) *progress {
	p := &progress{r: r, w: w, tty: isTerminal(w), quit: make(chan struct{}), done: make(chan struct{}), lastAt: r.start}
	go p.loop()
	return p
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.print(false)
		case <-p.quit:
			p.print(true)
			return
		}
	}
}

// stop writes the final line and returns once nothing more will be written.
func (p *progress) stop() {
	close(p.quit)
	<-p.done
}

func (p *progress) print(final bool) {
	r := p.r
	now := time.Now()
	r.mu.Lock()
	placed, acked, rejected, skipped := r.res.Placed, len(r.res.Acknowledged), r.res.RejectedByAPI, r.skipped
	errs := 0
	for _, n := range r.res.Errors {
		errs += n
	}
	p99 := r.hist.quantile(0.99)
	r.mu.Unlock()

	// The rate of the last second; the final line has the average of the whole run.
	since, before := p.lastAt, p.lastPlaced
	if final {
		since, before = r.start, 0
	}
	rate := 0.0
	if d := now.Sub(since).Seconds(); d > 0 {
		rate = float64(placed-before) / d
	}
	line := fmt.Sprintf("loadgen %6.1fs  placed %d  acked %d  rejected %d  errors %d  rate %s/s  p99 %s",
		now.Sub(r.start).Seconds(), placed, acked, rejected, errs, fmtRate(rate), fmtDuration(p99))
	if skipped > p.lastSkipped {
		line += fmt.Sprintf("  BEHIND the target %s/s: all %d workers busy", fmtRate(r.cfg.Rate), r.cfg.Concurrency)
	}
	p.lastAt, p.lastPlaced, p.lastSkipped = now, placed, skipped
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r%s\033[K\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r%s\033[K", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}
