package retry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	for n, ceiling := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, 50: time.Second, 1 << 30: time.Second,
	} {
		for range 200 {
			d := b.Delay(n)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("Delay(%d) = %s, want within [%s, %s]", n, d, ceiling/2, ceiling)
			}
		}
	}
	if d := (Backoff{}).Delay(3); d != 0 {
		t.Fatalf("a zero Backoff waits %s, want 0", d)
	}
	if d := (Backoff{Base: time.Second, Max: time.Millisecond}).Delay(1); d < 500*time.Millisecond {
		t.Fatalf("a Max below Base caps at Base: got %s", d)
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	// Shortest waits: 50, 100, 200, 400, 500, 500, ... ms.
	for d, want := range map[time.Duration]int{
		0: 1, 49 * time.Millisecond: 1, 50 * time.Millisecond: 2, 150 * time.Millisecond: 3,
		time.Second: 5, 10 * time.Second: 23,
	} {
		if got := b.MaxAttempts(d); got != want {
			t.Errorf("MaxAttempts(%s) = %d, want %d", d, got, want)
		}
	}
	// A loop that really waits Delay never exceeds it.
	for range 50 {
		spent, n := time.Duration(0), 1
		for {
			spent += b.Delay(n)
			if spent > 3*time.Second {
				break
			}
			n++
		}
		if n > b.MaxAttempts(3*time.Second) {
			t.Fatalf("%d attempts in 3s, MaxAttempts says %d", n, b.MaxAttempts(3*time.Second))
		}
	}
}

func TestStreakLogsOnce(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Unix(1_000_000, 0)
	s := &Streak{
		What:        "loop",
		Logger:      slog.New(slog.NewTextHandler(&buf, nil)),
		Backoff:     Backoff{Base: time.Millisecond, Max: 8 * time.Millisecond},
		LogInterval: 10 * time.Second,
		now:         func() time.Time { return now },
	}
	ctx := context.Background()
	s.Succeed(ctx) // no streak: nothing to say
	if buf.Len() != 0 {
		t.Fatalf("a success without a streak logged %q", buf.String())
	}
	boom := errors.New("boom")
	for range 1000 { // a second of attempts: one line
		if d := s.Fail(ctx, boom); d > 8*time.Millisecond {
			t.Fatalf("wait %s above Max", d)
		}
		now = now.Add(time.Millisecond)
	}
	if got := lines(&buf); len(got) != 1 || !strings.Contains(got[0], "loop: failing") || !strings.Contains(got[0], "boom") {
		t.Fatalf("after 1000 failures in 1s: %q, want one line entering the failure", got)
	}
	for range 25 { // 25 s more: two lines, at 10 s and 20 s
		s.Fail(ctx, boom)
		now = now.Add(time.Second)
	}
	got := lines(&buf)
	if len(got) != 3 || !strings.Contains(got[1], "still failing") || !strings.Contains(got[1], "failed_attempts=1010") ||
		!strings.Contains(got[1], "since_last_line=1009") || !strings.Contains(got[1], "down_for=10s") {
		t.Fatalf("after 26s of failures: %q", got)
	}
	if s.Failures() != 1025 {
		t.Fatalf("Failures() = %d, want 1025", s.Failures())
	}
	s.Succeed(ctx)
	s.Succeed(ctx)
	got = lines(&buf)
	if len(got) != 4 || !strings.Contains(got[3], "loop: recovered") || !strings.Contains(got[3], "failed_attempts=1025") ||
		!strings.Contains(got[3], "down_for=26s") {
		t.Fatalf("after recovering: %q", got)
	}
	if s.Failures() != 0 {
		t.Fatalf("Failures() = %d after a success", s.Failures())
	}
	// A new streak logs its first failure again, at once.
	s.Fail(ctx, boom)
	if got := lines(&buf); len(got) != 5 || !strings.Contains(got[4], "loop: failing") {
		t.Fatalf("a new streak: %q", got)
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep returned early")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Fatal("Sleep with an ended context waited")
	}
}

func lines(b *bytes.Buffer) []string {
	return strings.Split(strings.TrimSpace(b.String()), "\n")
}
