package inbox

import (
	"context"
	"fmt"
	"strings"
	"text/template"
)

// Store is the inbox of one set of [Tables]; the package-level functions are the methods of
// the store of the default Tables. A Store holds no connection and no state but its
// statements: make one per set of tables, at start-up, and share it. Its methods are safe for
// concurrent use.
type Store struct {
	tables Tables
	sql    statements
	// text is the inbox table's name as text, for to_regclass: the class of a partitioned
	// inbox's message locks, taken for every message.
	text string
}

// statements are the SQL of a Store, rendered once for its tables from the templates named
// in [newStatements]. Table names are quoted in them; values are always parameters.
type statements struct {
	insertMessage, insertMessages string
	cleanupCutoff, cleanupBatch   string
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
	return &Store{tables: t, sql: sql, text: t.sqlNames().MessagesText}, nil
}

// Tables returns the store's tables, with their defaults filled in.
func (s *Store) Tables() Tables { return s.tables }

// Migrate is [Migrate] for the store's tables: it brings them to the version this package
// needs, with their own version table and advisory lock, and creates their Schema first when
// it is set and missing.
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
		{"insertMessage", &s.insertMessage, insertMessageSQL},
		{"insertMessages", &s.insertMessages, insertMessagesSQL},
		{"cleanupCutoff", &s.cleanupCutoff, cleanupCutoffSQL},
		{"cleanupBatch", &s.cleanupBatch, cleanupBatchSQL},
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
// schema-qualified inbox table.
func renderStatement(name, text string, n sqlNames) (string, error) {
	tmpl, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("inbox: parse statement %s: %w", name, err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, n); err != nil {
		return "", fmt.Errorf("inbox: render statement %s: %w", name, err)
	}
	return b.String(), nil
}
