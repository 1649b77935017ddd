// Package pgtrace makes an OpenTelemetry span of each query and batch that pgx runs inside
// traced work: a pgx.QueryTracer and pgx.BatchTracer for pgxpool.Config.ConnConfig.Tracer.
//
// A query gets a span only when its ctx already carries a valid span context (an HTTP
// request's server span, a consumer's process span): the relay's polling, the cleanups and
// the metrics' reads, which run on contexts of their own, would otherwise start a new trace
// every second. The span is named after the statement ("SELECT orders", "INSERT
// outbox_messages"), carries db.system.name=postgresql, db.operation.name and
// db.collection.name when the statement names them, and db.query.text, the statement as
// written: the services' statements are parameterised constants, and the arguments are
// never recorded.
package pgtrace

import (
	"context"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the query spans.
const TracerName = "github.com/outboxshop/outboxshop/internal/pgtrace"

// maxQueryText bounds db.query.text.
const maxQueryText = 2048

// Tracer is a pgx.QueryTracer and pgx.BatchTracer making spans with a TracerProvider.
type Tracer struct {
	tracer trace.Tracer
}

var (
	_ pgx.QueryTracer = (*Tracer)(nil)
	_ pgx.BatchTracer = (*Tracer)(nil)
)

// New returns a Tracer making spans with tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(TracerName)}
}

// spanKey marks a ctx whose span this package started, so that the end hooks end only
// their own span, never the caller's.
type spanKey struct{}

// start starts a span named name when ctx carries a span context, with the attributes of
// conn's database (db.system.name, db.namespace, server.address) and attrs.
func (t *Tracer) start(ctx context.Context, conn *pgx.Conn, name string, attrs ...attribute.KeyValue) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	attrs = append(attrs, semconv.DBSystemNamePostgreSQL)
	if conn != nil {
		if c := conn.Config(); c != nil {
			attrs = append(attrs, semconv.DBNamespace(c.Database), semconv.ServerAddress(c.Host), semconv.ServerPort(int(c.Port)))
		}
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{}, span)
}

func end(ctx context.Context, err error, attrs ...attribute.KeyValue) {
	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return
	}
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// TraceQueryStart starts the span of a query (Query, QueryRow, Exec).
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	// Every query of the pool comes here, the relay's polls and claims included: outside
	// traced work it returns before describe's regular expression and allocations.
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	name, attrs := describe(data.SQL)
	return t.start(ctx, conn, name, attrs...)
}

// TraceQueryEnd ends the span TraceQueryStart started, with the rows affected and the error.
func (t *Tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	end(ctx, data.Err, attribute.Int64("db.response.affected_rows", data.CommandTag.RowsAffected()))
}

// TraceBatchStart starts the span of a batch, "BATCH", with its size.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	n := 0
	if data.Batch != nil {
		n = data.Batch.Len()
	}
	return t.start(ctx, conn, "BATCH", semconv.DBOperationName("BATCH"), semconv.DBOperationBatchSize(n))
}

// TraceBatchQuery records each query of a batch as an event of the batch's span.
func (t *Tracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return
	}
	_, attrs := describe(data.SQL)
	if data.Err != nil {
		attrs = append(attrs, attribute.String("error.message", data.Err.Error()))
	}
	span.AddEvent("query", trace.WithAttributes(attrs...))
}

// TraceBatchEnd ends the batch's span.
func (t *Tracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	end(ctx, data.Err)
}

// target finds the table a statement works on, after its first FROM, INTO or UPDATE.
var target = regexp.MustCompile(`(?i)\b(?:from|into|update)\s+((?:"[^"]+"|[a-z_][a-z0-9_$]*)(?:\.(?:"[^"]+"|[a-z_][a-z0-9_$]*))?)`)

// describe names a statement's span "{operation} {table}" (or the operation alone) and
// returns its attributes: the operation, the table when found, and the text.
func describe(sql string) (string, []attribute.KeyValue) {
	text := strings.TrimSpace(sql)
	if len(text) > maxQueryText {
		// Cut on a character boundary: a span attribute must be valid UTF-8.
		text = strings.ToValidUTF8(text[:maxQueryText], "")
	}
	attrs := []attribute.KeyValue{semconv.DBQueryText(text)}
	op := operation(text)
	if op == "" {
		return "postgresql", attrs
	}
	attrs = append(attrs, semconv.DBOperationName(op))
	if op == "WITH" {
		// A common table expression: its first statement's table says little.
		return op, attrs
	}
	if m := target.FindStringSubmatch(text); m != nil {
		table := strings.ReplaceAll(m[1], `"`, "")
		attrs = append(attrs, semconv.DBCollectionName(table))
		return op + " " + table, attrs
	}
	return op, attrs
}

// operation is the statement's first keyword, upper case, skipping leading comments.
func operation(sql string) string {
	for {
		sql = strings.TrimSpace(sql)
		switch {
		case strings.HasPrefix(sql, "--"):
			i := strings.IndexByte(sql, '\n')
			if i < 0 {
				return ""
			}
			sql = sql[i+1:]
			continue
		case strings.HasPrefix(sql, "/*"):
			i := strings.Index(sql, "*/")
			if i < 0 {
				return ""
			}
			sql = sql[i+2:]
			continue
		}
		break
	}
	i := strings.IndexFunc(sql, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') })
	if i < 0 {
		i = len(sql)
	}
	return strings.ToUpper(sql[:i])
}
