package chaos

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The load generator counts its retries and replays, and keeps the last 201 of each key; a
// scenario about what a client was told during an outage needs more: every answer of every
// key, in order. answerLog records them from the load generator's HTTP client
// ([Scenario].RecordAnswers).

// attempt is one POST /orders of the load generator: its Idempotency-Key, when it was sent
// and answered (zero while in flight), and the answer (Status 0: none, Err says why).
type attempt struct {
	Key            string
	Sent, Answered time.Time
	Status         int
	Replayed       bool
	Err            string
}

// inFlight reports an attempt not answered yet.
func (a attempt) inFlight() bool { return a.Answered.IsZero() }

// failed reports an answered attempt that the client retries: no answer, a 5xx or a 429.
func (a attempt) failed() bool {
	return !a.inFlight() && (a.Status == 0 || a.Status >= 500 || a.Status == http.StatusTooManyRequests)
}

// describe is the attempt as a report shows it, its times from base: "503 at 7.2s",
// "201 (replayed) at 12.3s", "no answer at 9.1s (EOF)".
func (a attempt) describe(base time.Time) string {
	at := fmt.Sprintf(" at %.1fs", a.Answered.Sub(base).Seconds())
	switch {
	case a.inFlight():
		return fmt.Sprintf("no answer yet (sent at %.1fs)", a.Sent.Sub(base).Seconds())
	case a.Status == 0:
		return "no answer" + at + " (" + a.Err + ")"
	case a.Replayed:
		return fmt.Sprintf("%d (replayed)%s", a.Status, at)
	default:
		return fmt.Sprintf("%d%s", a.Status, at)
	}
}

// answerLog records the attempts of POST /orders that carry an Idempotency-Key, each as it
// is sent (a retry that waits for its answer counts as sent) and again as it is answered.
type answerLog struct {
	mu       sync.Mutex
	attempts []attempt
}

// client returns an HTTP client as the load generator's own (a 10s timeout, concurrency
// keep-alive connections) that records into the log.
func (l *answerLog) client(concurrency int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(tr.MaxIdleConns, concurrency)
	tr.MaxIdleConnsPerHost = concurrency
	return &http.Client{Timeout: 10 * time.Second, Transport: recordingTransport{base: tr, log: l}}
}

// recordingTransport records each POST /orders with an Idempotency-Key it carries.
type recordingTransport struct {
	base http.RoundTripper
	log  *answerLog
}

func (t recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.Header.Get("Idempotency-Key")
	if req.Method != http.MethodPost || req.URL.Path != "/orders" || key == "" {
		return t.base.RoundTrip(req)
	}
	i := t.log.sent(key)
	resp, err := t.base.RoundTrip(req)
	t.log.answered(i, resp, err)
	return resp, err
}

// sent records an attempt of key sent now, and returns its index for answered.
func (l *answerLog) sent(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts = append(l.attempts, attempt{Key: key, Sent: time.Now()})
	return len(l.attempts) - 1
}

// answered records the answer of attempt i, or the error that took its place.
func (l *answerLog) answered(i int, resp *http.Response, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := &l.attempts[i]
	a.Answered = time.Now()
	if err != nil {
		a.Err = err.Error()
		return
	}
	a.Status, a.Replayed = resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
}

// all returns every attempt so far, in the order they were sent.
func (l *answerLog) all() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.attempts)
}

// byKey groups attempts by key, each key's in the order they were sent.
func byKey(attempts []attempt) map[string][]attempt {
	out := map[string][]attempt{}
	for _, a := range attempts {
		out[a.Key] = append(out[a.Key], a)
	}
	for _, as := range out {
		slices.SortStableFunc(as, func(a, b attempt) int { return a.Sent.Compare(b.Sent) })
	}
	return out
}

// retriedSince counts the keys that had an attempt fail (answered at or after since) and
// then sent another: clients that retried after a failure the fault caused.
func retriedSince(attempts []attempt, since time.Time) int {
	n := 0
	for _, as := range byKey(attempts) {
		for i, a := range as {
			if a.failed() && !a.Answered.Before(since) && slices.ContainsFunc(as[i+1:], func(b attempt) bool { return !b.Sent.Before(a.Answered) }) {
				n++
				break
			}
		}
	}
	return n
}

// failedIn counts the keys with a failed attempt answered in [from, to).
func failedIn(attempts []attempt, from, to time.Time) int {
	keys := map[string]bool{}
	for _, a := range attempts {
		if a.failed() && !a.Answered.Before(from) && a.Answered.Before(to) {
			keys[a.Key] = true
		}
	}
	return len(keys)
}

// ackedAfterFailure lists the keys whose first 201 was a replay that came after a failed
// attempt: the client was never told the first time, the order had committed meanwhile.
// These are the answers a commit on the primary alone can produce.
func ackedAfterFailure(attempts []attempt) []string {
	var keys []string
	for key, as := range byKey(attempts) {
		failed := false
		for _, a := range as {
			if a.Status == http.StatusCreated {
				if failed && a.Replayed {
					keys = append(keys, key)
				}
				break
			}
			failed = failed || a.failed()
		}
	}
	slices.Sort(keys)
	return keys
}

// history is a key's attempts as a report shows them: "503 at 7.2s, 201 (replayed) at 12.3s".
func history(as []attempt, base time.Time) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = a.describe(base)
	}
	return strings.Join(parts, ", ")
}
