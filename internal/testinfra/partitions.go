package testinfra

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PartitionRange is one partition of a table, as the catalog has it.
type PartitionRange struct {
	Name     string
	From, To time.Time
}

// Partitions lists the partitions of table (its name as SQL writes it), oldest first.
func Partitions(t testing.TB, db *pgxpool.Pool, table string) []PartitionRange {
	t.Helper()
	rows, err := db.Query(context.Background(), `
SELECT c.relname,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass ORDER BY 2`, table)
	if err != nil {
		t.Fatalf("list the partitions of %s: %v", table, err)
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (p PartitionRange, err error) {
		return p, r.Scan(&p.Name, &p.From, &p.To)
	})
	if err != nil {
		t.Fatalf("list the partitions of %s: %v", table, err)
	}
	return parts
}

// RequireContiguous fails the test unless parts follow each other without a gap or an
// overlap, and cover from at to until.
func RequireContiguous(t testing.TB, parts []PartitionRange, at, until time.Time) {
	t.Helper()
	if len(parts) == 0 {
		t.Fatal("no partition")
	}
	for i := 1; i < len(parts); i++ {
		if !parts[i].From.Equal(parts[i-1].To) {
			t.Fatalf("partition %s does not follow %s: %v", parts[i].Name, parts[i-1].Name, parts)
		}
	}
	if parts[0].From.After(at) {
		t.Fatalf("the first partition begins after %s: %v", at, parts[0])
	}
	if !parts[len(parts)-1].To.After(until) {
		t.Fatalf("the last partition ends by %s: %v", until, parts[len(parts)-1])
	}
}
