package inbox

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/pgpartition"
)

// Tables names the tables of one inbox; the zero value is the default. The index and
// constraints of the Messages table ("<Messages>_processed_at_idx", …) and the advisory lock
// key of its migrations are derived from the names (the default Tables keep those of earlier
// versions). The inbox has no triggers, functions or notification channels.
type Tables struct {
	// Schema holds the tables. Empty: unqualified names, resolved through search_path.
	Schema string
	// Messages is the inbox table. Default inbox_messages. At most [MaxTableBytes] bytes, so
	// that the names derived from it fit PostgreSQL's 63-byte identifiers.
	Messages string
	// Migrations is the table [Migrate] records applied versions in. Default: Messages with
	// its "_messages" suffix replaced by "_migrations" (inbox_migrations for the default Messages),
	// or Messages + "_migrations". Tables in one schema whose defaults meet ("orders" and
	// "orders_messages"; "inbox" and the default Messages) need one set here: [Migrate]
	// refuses a version table that records versions while its own Messages table is missing.
	Migrations string
	// Partition, when set, makes Messages a table partitioned by range of processed_at, one
	// partition per Partition of time (aligned on multiples of it since the Unix epoch, UTC),
	// which [Migrate] and [Cleanup] create ahead and Cleanup drops whole once their retention
	// is over (README.md#partitioned-tables). From a minute to a day, and a day must be a
	// whole number of them. Zero, the default: one plain table, whose old rows Cleanup
	// deletes.
	Partition time.Duration
}

// DefaultMessagesTable is the inbox table's name when [Tables.Messages] is empty.
const DefaultMessagesTable = "inbox_messages"

// MaxTableBytes is the longest [Tables.Messages] may be.
const MaxTableBytes = 40

// ErrInvalidTables is wrapped by [Tables.Validate]'s errors.
var ErrInvalidTables = errors.New("inbox: invalid table names")

// WithDefaults returns t with its empty names replaced by the defaults.
func (t Tables) WithDefaults() Tables {
	if t.Messages == "" {
		t.Messages = DefaultMessagesTable
	}
	if t.Migrations == "" {
		base, ok := strings.CutSuffix(t.Messages, "_messages")
		if !ok {
			base = t.Messages
		}
		t.Migrations = base + "_migrations"
	}
	return t
}

// Validate reports whether t, with its defaults, names usable tables: valid UTF-8 without
// NUL bytes, Messages at most [MaxTableBytes] bytes, Schema and Migrations at most 63,
// Messages and Migrations different, and Partition zero or as its comment says. Names are quoted in every statement, so any other
// character, case included, is kept as written. The error wraps [ErrInvalidTables].
func (t Tables) Validate() error {
	t = t.WithDefaults()
	for _, f := range []struct {
		field, value string
		limit        int
	}{
		{"Schema", t.Schema, 63},
		// The longest name derived from Messages, "<Messages>_message_id_not_empty", adds 21
		// bytes, and PostgreSQL cuts identifiers at 63.
		{"Messages", t.Messages, MaxTableBytes},
		{"Migrations", t.Migrations, 63},
	} {
		switch {
		case len(f.value) > f.limit:
			return fmt.Errorf("%w: %s is %d bytes long, more than %d", ErrInvalidTables, f.field, len(f.value), f.limit)
		case !utf8.ValidString(f.value):
			return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidTables, f.field)
		case strings.IndexByte(f.value, 0) >= 0:
			return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidTables, f.field)
		}
	}
	if t.Messages == t.Migrations {
		return fmt.Errorf("%w: Messages and Migrations are both %q", ErrInvalidTables, t.Messages)
	}
	if p := t.Partition; p != 0 && !pgpartition.ValidEvery(p) {
		return fmt.Errorf("%w: Partition is %s: it must be a whole number of minutes, from 1m to 24h, that divides a day", ErrInvalidTables, p)
	}
	return nil
}

// String returns the schema-qualified name of the inbox table, as written in SQL.
func (t Tables) String() string {
	return t.WithDefaults().qualified(t.WithDefaults().Messages)
}

// isDefault tells whether t names the tables of the zero Tables, partitioned or not.
func (t Tables) isDefault() bool {
	t.Partition = 0
	return t.WithDefaults() == Tables{}.WithDefaults()
}

// qualified quotes name, prefixed by t's schema if any.
func (t Tables) qualified(name string) string {
	if t.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// lockKey derives a 64-bit advisory lock key from t's names and purpose; the default tables
// keep the key older versions used, so that processes of both versions serialise.
func (t Tables) lockKey(purpose string, legacy int64) int64 {
	t = t.WithDefaults()
	if t.isDefault() {
		return legacy
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "inbox\x00%s\x00%s\x00%s", purpose, t.Schema, t.Messages)
	return int64(h.Sum64()) //nolint:gosec // any 64 bits will do
}

// sqlNames are t's names as SQL spells them, for statements and migration templates.
type sqlNames struct {
	// Messages and Migrations are the tables, quoted and schema-qualified.
	Messages, Migrations string
	// MessagesText and MigrationsText are the same names as text, for to_regclass.
	MessagesText, MigrationsText string
	// Schema is the schema, quoted; empty when unqualified.
	Schema string
	// Partitioned: the table is partitioned by range of processed_at ([Tables.Partition]).
	Partitioned bool
	t           Tables
}

// Local returns the quoted, unqualified name of an object derived from the inbox table (an
// index or a constraint: PostgreSQL puts them in the table's schema): "<Messages>_<suffix>".
func (n sqlNames) Local(suffix string) string {
	return pgx.Identifier{n.t.Messages + "_" + suffix}.Sanitize()
}

// Qualified returns the same name, schema-qualified, as DROP INDEX needs it.
func (n sqlNames) Qualified(suffix string) string {
	return n.t.qualified(n.t.Messages + "_" + suffix)
}

func (t Tables) sqlNames() sqlNames {
	t = t.WithDefaults()
	n := sqlNames{
		Messages:    t.qualified(t.Messages),
		Migrations:  t.qualified(t.Migrations),
		Partitioned: t.Partition != 0,
		t:           t,
	}
	n.MessagesText, n.MigrationsText = n.Messages, n.Migrations
	if t.Schema != "" {
		n.Schema = pgx.Identifier{t.Schema}.Sanitize()
	}
	return n
}
