package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// logLine is one line as slog's JSON handler writes it.
func logLine(at time.Time, level, msg string) string {
	return fmt.Sprintf(`{"time":%q,"level":%q,"msg":%q,"service":"orders","error":"dial tcp: connection refused"}`+"\n",
		at.Format(time.RFC3339Nano), level, msg)
}

func TestBusiestSecond(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 13, 46, 4, 0, time.UTC)

	t.Run("CountsWarningsAndErrorsPerSecond", func(t *testing.T) {
		t.Parallel()
		var b strings.Builder
		b.WriteString(`### chaos: orders-relay incarnation 1 started 2026-12-03T13:46:00Z failpoints=""` + "\n")
		b.WriteString(logLine(t0.Add(-time.Second), "WARN", "outbox relay paused"))
		for i := range 300 {
			// Three seconds' worth of INFO: the access log grows with the load, uncounted.
			b.WriteString(logLine(t0.Add(time.Duration(i)*10*time.Millisecond), "INFO", "message processed"))
		}
		for i := range 5 {
			at := t0.Add(time.Second + time.Duration(i)*100*time.Millisecond)
			b.WriteString(logLine(at, "WARN", "outbox relay: mark waiting rows"))
			b.WriteString(logLine(at, "WARN", "outbox relay: repair waiting rows"))
			b.WriteString(logLine(at, "WARN", "outbox relay: repair waiting rows"))
		}
		b.WriteString(logLine(t0.Add(1900*time.Millisecond), "ERROR+2", "relay stopped"))
		b.WriteString(logLine(t0.Add(2*time.Second), "DEBUG", "cycle"))
		b.WriteString("panic: not JSON\n")

		got := busiestSecond(OrdersRelay, b.String(), nil)
		require.Equal(t, OrdersRelay, got.Service)
		require.True(t, got.Second.Equal(t0.Add(time.Second)), "second %s", got.Second)
		require.Equal(t, 16, got.Lines)
		require.Equal(t, "outbox relay: repair waiting rows", got.Msg)
		require.Equal(t, 10, got.MsgLines)
	})

	t.Run("WallClockSecondsNotWindows", func(t *testing.T) {
		t.Parallel()
		// 150 lines at the end of one second and 150 at the start of the next: two seconds
		// of 150, not one of 300.
		var b strings.Builder
		for i := range 150 {
			b.WriteString(logLine(t0.Add(-time.Duration(i+1)*time.Millisecond), "WARN", "a"))
			b.WriteString(logLine(t0.Add(time.Duration(i)*time.Millisecond), "WARN", "b"))
		}
		got := busiestSecond(Warehouse, b.String(), nil)
		require.Equal(t, 150, got.Lines)
		require.True(t, got.Second.Equal(t0.Add(-time.Second)), "the earliest of equal seconds: %s", got.Second)
		require.Equal(t, "a", got.Msg)
	})

	t.Run("TimeZones", func(t *testing.T) {
		t.Parallel()
		cet := time.FixedZone("CET", 3600)
		logs := logLine(t0.Add(300*time.Millisecond), "ERROR", "x") + logLine(t0.In(cet).Add(700*time.Millisecond), "ERROR", "x")
		got := busiestSecond(OrdersAPI, logs, nil)
		require.Equal(t, 2, got.Lines, "one second, written in two zones")
	})

	t.Run("PerMessageWarningsLeftOut", func(t *testing.T) {
		t.Parallel()
		// 300 refusals of a scenario's own making and 5 other warnings in one second.
		var b strings.Builder
		for i := range 300 {
			b.WriteString(logLine(t0.Add(time.Duration(i)*time.Millisecond), "WARN", "OrderCreated refused: dead-lettering it"))
		}
		for i := range 5 {
			b.WriteString(logLine(t0.Add(time.Duration(i)*time.Millisecond), "WARN", "inbox: retrying"))
		}
		got := busiestSecond(Warehouse, b.String(), []string{"OrderCreated refused: dead-lettering it"})
		require.Equal(t, 5, got.Lines)
		require.Equal(t, "inbox: retrying", got.Msg)
		require.Equal(t, 305, busiestSecond(Warehouse, b.String(), nil).Lines)
	})

	t.Run("Quiet", func(t *testing.T) {
		t.Parallel()
		got := busiestSecond(OrdersAPI, logLine(t0, "INFO", "order created"), nil)
		require.Equal(t, LogBurst{Service: OrdersAPI}, got)
		require.Equal(t, "–", formatBurst(got))
	})
}

// logsTarget serves logs and CPU readings from maps; every other method is the nil
// interface's (it panics).
type logsTarget struct {
	Target
	logs map[Service]string
	cpu  map[Service][]ProcessCPU // successive readings
}

func (f *logsTarget) Logs(_ context.Context, svc Service) (string, error) {
	logs, ok := f.logs[svc]
	if !ok {
		return "", fmt.Errorf("no log of %s", svc)
	}
	return logs, nil
}

func (f *logsTarget) CPUTime(_ context.Context, svc Service) (ProcessCPU, error) {
	r, ok := f.cpu[svc]
	if !ok {
		return ProcessCPU{}, fmt.Errorf("CPU time of %s: %w", svc, ErrUnsupported)
	}
	f.cpu[svc] = r[1:]
	return r[0], nil
}

func TestCheckLogBursts(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 13, 46, 4, 0, time.UTC)
	spin := func(n int, msg string) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(logLine(t0.Add(time.Duration(i)*time.Second/time.Duration(n)), "WARN", msg))
		}
		return b.String()
	}

	t.Run("OverTheBoundFails", func(t *testing.T) {
		t.Parallel()
		e := &Env{Target: &logsTarget{logs: map[Service]string{
			Warehouse:      spin(3, "inbox: retrying"),
			WarehouseRelay: spin(3598, "outbox relay: repair waiting rows"),
			OrdersRelay:    spin(maxWarnPerSecond, "outbox relay paused"),
		}}}
		got := checkLogBursts(t.Context(), e, []Service{Warehouse, WarehouseRelay, OrdersRelay})
		require.Equal(t, WarehouseRelay, got.Service)
		require.Equal(t, 3598, got.Lines)
		require.Equal(t, []string{
			`warehouse-relay logged 3598 warnings and errors in the second ` + t0.Local().Format(time.TimeOnly) +
				`, over 200 (3598× "outbox relay: repair waiting rows")`,
		}, e.failures, "200 in a second is still allowed")
		require.Len(t, e.seen, 1)
		require.Contains(t, e.seen[0], "busiest second of warnings and errors: warehouse-relay, 3598 lines")
		require.Contains(t, e.seen[0], "per process warehouse 3, warehouse-relay 3598, orders-relay 200")
	})

	t.Run("UnreadLogFails", func(t *testing.T) {
		t.Parallel()
		e := &Env{Target: &logsTarget{logs: map[Service]string{Warehouse: ""}}}
		got := checkLogBursts(t.Context(), e, []Service{Warehouse, OrdersAPI})
		require.Zero(t, got.Lines)
		require.Equal(t, []string{"read the log of orders-api for its warnings and errors: no log of orders-api"}, e.failures)
		require.Equal(t, []string{"no process logged a warning or an error"}, e.seen)
	})
}

func TestOutageCPU(t *testing.T) {
	t.Parallel()
	at := func(incarnation int, used time.Duration) ProcessCPU {
		return ProcessCPU{Incarnation: incarnation, Used: used}
	}
	f := &logsTarget{cpu: map[Service][]ProcessCPU{
		Warehouse:      {at(1, time.Second), at(1, time.Second+40*time.Millisecond)},
		WarehouseRelay: {at(1, 2*time.Second), at(1, 4*time.Second)}, // 2s of CPU over the window
		OrdersRelay:    {at(1, time.Second), at(2, 0)},
	}}
	e := &Env{Target: f, processes: []Service{Warehouse, WarehouseRelay, OrdersRelay, OrdersAPI}}
	w := e.outageStarts(t.Context(), "the warehouse database was down")
	w.start = time.Now().Add(-2 * time.Second) // as if 2s had passed
	e.outageEnds(t.Context(), w)

	require.Len(t, e.seen, 1)
	require.Regexp(t, `^CPU while the warehouse database was down \(2\.0s\): warehouse 0\.02 cores, warehouse-relay (1\.00|0\.99) cores, `+
		`orders-relay restarted meanwhile, orders-api unavailable on this target$`, e.seen[0])
	require.Len(t, e.failures, 1)
	require.Regexp(t, `^warehouse-relay used (1\.00|0\.99) cores while the warehouse database was down \(2\.0s\), over 0\.50`, e.failures[0])

	t.Run("ShortWindowNotJudged", func(t *testing.T) {
		t.Parallel()
		f := &logsTarget{cpu: map[Service][]ProcessCPU{OrdersRelay: {at(1, 0), at(1, time.Second)}}}
		e := &Env{Target: f, processes: []Service{OrdersRelay}}
		w := e.outageStarts(t.Context(), "the broker was down")
		w.start = time.Now().Add(-time.Second)
		e.outageEnds(t.Context(), w)
		require.Empty(t, e.failures)
		require.Contains(t, e.seen[0], "orders-relay 1.00 cores")
	})
}

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	// A command name with a space and a parenthesis; utime 250, stime 31 ticks.
	stat := "4242 (orders (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 31 0 0 20 0 9 0 5000 1000000 2000 18446744073709551615"
	got, err := parseProcStat(stat)
	require.NoError(t, err)
	require.Equal(t, 2810*time.Millisecond, got)

	_, err = parseProcStat("4242 orders S 1")
	require.Error(t, err)
	_, err = parseProcStat("4242 (orders) S 1 2 3")
	require.Error(t, err)

	// The test's own process, read for real: it counts the CPU this loop burns (a fresh
	// process may not have used a whole clock tick yet).
	deadline := time.Now().Add(10 * time.Second)
	for sum := 0; ; sum++ {
		self, err := procCPUTime(os.Getpid())
		require.NoError(t, err)
		if self > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no CPU time counted after 10s of work (%d)", sum)
	}
}
