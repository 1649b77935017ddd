package outbox

import (
	"context"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
)

// Store is the outbox of one set of [Tables]. It holds no connection, only its statements,
// rendered once: make one per set of tables at start-up and share it; it is safe for
// concurrent use.
type Store struct {
	tables  Tables
	channel string
	sql     statements
	// propagator records the trace context in Add; nil: the global one.
	propagator propagation.TextMapPropagator
}

// WithPropagator returns a copy of s whose Add, AddSQL and QueueAdd record the trace context
// through p instead of the global propagator (nil). Give the relay the same
// ([Config].Propagator).
func (s *Store) WithPropagator(p propagation.TextMapPropagator) *Store {
	c := *s
	c.propagator = p
	return &c
}

// statements are the SQL of a Store, rendered once for its tables from the templates named
// in [newStatements]. Table names are quoted in them; values are always parameters.
type statements struct {
	insertMessage, insertMessages         string
	stats                                 string
	listDead, requeueDead                 string
	cleanupCutoff, deletePublished        string
	claimBatch, markPublished, markFailed string
	deleteConfirmed                       string
	markDeferred, releaseNext             string
	markWaiting, repairWaiting            string
	// The WAL relay's (walrelay.go).
	claimHanded, markHeld, pendingBefore, handPending string
	heldAggregates, stillHeld                         string
	publicationHas                                    string
	// listen is LISTEN on the table's notify channel.
	listen string
}

// NewStore returns the store of t's tables. It checks t ([Tables.Validate]: the error wraps
// [ErrInvalidTables]) and prepares every statement once. It does not touch the database:
// create the tables with [Store.Migrate].
func NewStore(t Tables) (*Store, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	t = t.WithDefaults()
	sql, err := newStatements(t.sqlNames())
	if err != nil {
		return nil, err
	}
	channel := t.NotifyChannel()
	sql.listen = "LISTEN " + pgx.Identifier{channel}.Sanitize()
	return &Store{tables: t, channel: channel, sql: sql}, nil
}

// Tables returns the store's tables, with their defaults filled in.
func (s *Store) Tables() Tables { return s.tables }

// Migrate is [Migrate] for the store's tables, with their own version table and lock; it
// creates their Schema first when it is set and missing.
func (s *Store) Migrate(ctx context.Context, db TxBeginner) error {
	return migrate(ctx, db, s.tables)
}

// defaultStore is the store of the default tables, behind the package-level functions.
var defaultStore = func() *Store {
	s, err := NewStore(Tables{})
	if err != nil {
		panic(err) // the templates are constants of this package: covered by every test
	}
	return s
}()

// newStatements renders every statement template for n.
func newStatements(n sqlNames) (statements, error) {
	var s statements
	for _, st := range []struct {
		name string
		dst  *string
		tmpl string
	}{
		{"insertMessage", &s.insertMessage, insertMessage},
		{"insertMessages", &s.insertMessages, insertMessages},
		{"statsQuery", &s.stats, statsQuery},
		{"listDead", &s.listDead, listDead},
		{"requeueDead", &s.requeueDead, requeueDead},
		{"cleanupCutoff", &s.cleanupCutoff, cleanupCutoff},
		{"deletePublished", &s.deletePublished, deletePublished},
		{"claimBatch", &s.claimBatch, claimBatch},
		{"markPublished", &s.markPublished, markPublished},
		{"deleteConfirmed", &s.deleteConfirmed, deleteConfirmed},
		{"markFailed", &s.markFailed, markFailed},
		{"markDeferred", &s.markDeferred, markDeferred},
		{"releaseNext", &s.releaseNext, releaseNext},
		{"markWaiting", &s.markWaiting, markWaiting},
		{"repairWaiting", &s.repairWaiting, repairWaiting},
		{"claimHanded", &s.claimHanded, claimHanded},
		{"markHeld", &s.markHeld, markHeld},
		{"pendingBefore", &s.pendingBefore, pendingBefore},
		{"handPending", &s.handPending, handPending},
		{"heldAggregates", &s.heldAggregates, heldAggregates},
		{"stillHeld", &s.stillHeld, stillHeld},
		{"publicationHas", &s.publicationHas, publicationHas},
	} {
		sql, err := renderStatement(st.name, st.tmpl, n)
		if err != nil {
			return statements{}, err
		}
		*st.dst = sql
	}
	return s, nil
}

// renderStatement executes the statement template text with n: {{.Messages}} is the quoted,
// schema-qualified outbox table.
func renderStatement(name, text string, n sqlNames) (string, error) {
	tmpl, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("outbox: parse statement %s: %w", name, err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, n); err != nil {
		return "", fmt.Errorf("outbox: render statement %s: %w", name, err)
	}
	return b.String(), nil
}
