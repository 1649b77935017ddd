package pgmigrate

import (
	"context"
	_ "embed" // describe.sql
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DescribeSQL lists a schema's tables, columns, indexes, constraints, triggers, functions
// and comments from PostgreSQL's catalog, one line per object, sorted. $1 is the schema, $2
// the tables to leave out.
//
//go:embed describe.sql
var DescribeSQL string

// Querier runs a query; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Describe returns [DescribeSQL]'s lines for schema, leaving out the tables named in skip,
// so that tests can compare schemas made different ways.
func Describe(ctx context.Context, db Querier, schema string, skip ...string) ([]string, error) {
	if skip == nil {
		skip = []string{}
	}
	rows, err := db.Query(ctx, DescribeSQL, schema, skip)
	if err != nil {
		return nil, fmt.Errorf("describe schema %q: %w", schema, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("describe schema %q: %w", schema, err)
	}
	return lines, nil
}
