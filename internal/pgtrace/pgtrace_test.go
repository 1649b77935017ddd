package pgtrace_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxshop/outboxshop/internal/pgtrace"
	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })

	cfg, err := pgxpool.ParseConfig(testinfra.DatabaseURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = pgtrace.New(tp)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)`)
	require.NoError(t, err)
	require.Empty(t, rec.Ended(), "no span outside traced work")

	tctx, parent := tp.Tracer("test").Start(ctx, "POST /items")
	_, err = pool.Exec(tctx, `INSERT INTO items (id, name) VALUES ($1, $2)`, 1, "secret-value")
	require.NoError(t, err)
	var name string
	require.NoError(t, pool.QueryRow(tctx, `-- the item's name
		SELECT name FROM public.items WHERE id = $1`, 1).Scan(&name))
	_, err = pool.Exec(tctx, `INSERT INTO items (id, name) VALUES ($1, $2)`, 1, "again")
	require.Error(t, err, "a duplicate key")
	b := &pgx.Batch{}
	b.Queue(`UPDATE items SET name = $1 WHERE id = $2`, "x", 1)
	b.Queue(`DELETE FROM items WHERE id = $1`, 2)
	require.NoError(t, pool.SendBatch(tctx, b).Close())
	parent.End()

	spans := rec.Ended()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
		if s.Name() == "POST /items" {
			continue
		}
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the work's span", s.Name())
		require.Equal(t, trace.SpanKindClient, s.SpanKind())
		a := attrs(s)
		require.Equal(t, "postgresql", a["db.system.name"].AsString())
		require.NotEmpty(t, a["db.namespace"].AsString())
		for _, kv := range s.Attributes() {
			require.NotContains(t, kv.Value.Emit(), "secret-value", "parameters are never recorded")
		}
	}
	require.Equal(t, []string{"INSERT items", "SELECT public.items", "INSERT items", "BATCH", "POST /items"}, names)

	insert := attrs(spans[0])
	require.Equal(t, "INSERT", insert["db.operation.name"].AsString())
	require.Equal(t, "items", insert["db.collection.name"].AsString())
	require.Equal(t, "INSERT INTO items (id, name) VALUES ($1, $2)", insert["db.query.text"].AsString())
	require.EqualValues(t, 1, insert["db.response.affected_rows"].AsInt64())
	require.Equal(t, codes.Unset, spans[0].Status().Code)
	require.Equal(t, codes.Error, spans[2].Status().Code, "the failed insert")
	batch := spans[3]
	require.EqualValues(t, 2, attrs(batch)["db.operation.batch.size"].AsInt64())
	require.Len(t, batch.Events(), 2, "one event per query of the batch")
}
