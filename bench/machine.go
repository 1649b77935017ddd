package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Machine is what the figures were measured on.
type Machine struct {
	CPU      string
	Cores    int
	MemBytes int64
	Go       string
	Postgres string
	RabbitMQ string
}

// String renders the machine on one line.
func (m Machine) String() string {
	mem := "? GiB"
	if m.MemBytes > 0 {
		mem = strconv.FormatFloat(float64(m.MemBytes)/(1<<30), 'f', 1, 64) + " GiB"
	}
	return fmt.Sprintf("%s, %d cores, %s RAM · %s · PostgreSQL %s · RabbitMQ %s",
		orUnknown(m.CPU), m.Cores, mem, m.Go, orUnknown(m.Postgres), orUnknown(m.RabbitMQ))
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// readMachine reads the CPU model and memory from /proc, and asks the servers their versions.
func (e *env) readMachine(ctx context.Context) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	m.CPU = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.TrimSuffix(procField("/proc/meminfo", "MemTotal"), " kB"), 10, 64); err == nil {
		m.MemBytes = kb << 10
	}
	if conn, err := pgx.Connect(ctx, e.cfg.PostgresURL); err == nil {
		var v string
		if conn.QueryRow(ctx, "SHOW server_version").Scan(&v) == nil {
			m.Postgres, _, _ = strings.Cut(v, " ")
		}
		_ = conn.Close(ctx)
	}
	if conn, err := e.dial("machine"); err == nil {
		if v, ok := conn.Properties["version"].(string); ok {
			m.RabbitMQ = v
		}
		_ = conn.Close()
	}
	return m
}

// procField returns the value of the first "key: value" line of a /proc file, or "".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
