package outboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// TB is the part of testing.TB the assertions use; *testing.T and *testing.B satisfy it.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

// Options configure the assertions. A nil *Options is the zero value.
type Options struct {
	// Tables names the outbox to look in; the zero value is the default outbox_messages.
	Tables outbox.Tables
}

// Expect describes a message a test expects. Zero fields match anything.
type Expect struct {
	// ID, when set, must equal the message's ID.
	ID uuid.UUID
	// Type, Exchange, RoutingKey, AggregateType and AggregateID, when not empty, must equal
	// the message's.
	Type          string
	Exchange      string
	RoutingKey    string
	AggregateType string
	AggregateID   string
	// Payload, when not nil, must be JSON-equal to the message's payload: the same values,
	// whatever the key order and white space. A json.RawMessage or []byte is JSON text; any
	// other value is encoded with encoding/json first (a struct, a map, a string).
	Payload any
	// Headers lists headers the message must have, with these values; the message may have
	// others.
	Headers map[string]string
}

// selectAdded returns the rows of the outbox table %s that the current transaction wrote: a
// row's xmin is one of the transaction's own ids (its top-level id or a savepoint's, both
// assigned no earlier than the top-level one, so age(xmin) <= 0) and that transaction is still
// in progress. Rows of other transactions are visible only once committed. $1 is the
// transaction's own id, read first so that age() measures from it.
const selectAdded = `
SELECT id, exchange, routing_key, type, aggregate_type, aggregate_id, payload::text, headers::text,
       created_at, attempts
FROM %s
WHERE age(xmin) <= 0
  AND pg_xact_status(($1::bigint - age(xmin))::text::xid8) = 'in progress'
ORDER BY seq`

// currentXactID assigns the transaction an id if it has none, and returns it.
const currentXactID = `SELECT pg_current_xact_id()::text::bigint`

// Added returns the messages that tx, an open transaction, added to the outbox, in the order
// they were added. tx must be the transaction itself (a pgx.Tx), not a pool: each statement
// on a pool is a transaction of its own, which added nothing. A row counts when tx wrote its
// current version, so a row tx updated (as a relay marks rows) counts too; code that only
// calls [outbox.Add] writes no other.
func Added(ctx context.Context, tx outbox.DBTX, opts *Options) ([]outbox.Message, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := opts.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("outboxtest: %w", err)
	}
	var xid int64
	if err := tx.QueryRow(ctx, currentXactID).Scan(&xid); err != nil {
		return nil, fmt.Errorf("outboxtest: read the transaction id: %w", err)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(selectAdded, opts.Tables.String()), xid)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: read the messages of %s: %w", opts.Tables.String(), err)
	}
	defer rows.Close()
	var msgs []outbox.Message
	for rows.Next() {
		var m outbox.Message
		var payload, headers string
		if err := rows.Scan(&m.ID, &m.Exchange, &m.RoutingKey, &m.Type, &m.AggregateType, &m.AggregateID,
			&payload, &headers, &m.CreatedAt, &m.Attempts); err != nil {
			return nil, fmt.Errorf("outboxtest: read a message: %w", err)
		}
		m.Payload = json.RawMessage(payload)
		if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
			return nil, fmt.Errorf("outboxtest: decode the headers of message %s: %w", m.ID, err)
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxtest: read the messages of %s: %w", opts.Tables.String(), err)
	}
	return msgs, nil
}

// RequireAdded asserts that exactly one message tx added matches want, and returns it. It
// fails t, naming every message tx added and how each differs from want, when none or
// several match.
func RequireAdded(ctx context.Context, t TB, tx outbox.DBTX, want Expect, opts *Options) outbox.Message {
	t.Helper()
	added := mustAdded(ctx, t, tx, opts)
	var matched []int
	for i, m := range added {
		if len(want.diff(m)) == 0 {
			matched = append(matched, i)
		}
	}
	switch len(matched) {
	case 1:
		return added[matched[0]]
	case 0:
		t.Errorf("outboxtest: no message added by the transaction matches\n  want: %s\n%s", want, describe(added, want))
	default:
		t.Errorf("outboxtest: %d messages added by the transaction match, want exactly one (messages %v)\n  want: %s\n%s",
			len(matched), matched, want, describe(added, want))
	}
	t.FailNow()
	return outbox.Message{}
}

// RequireAddedMany asserts that the messages tx added are exactly want, one message for each
// Expect, in the order they were added, and returns them. It fails t with the differences
// otherwise.
func RequireAddedMany(ctx context.Context, t TB, tx outbox.DBTX, want []Expect, opts *Options) []outbox.Message {
	t.Helper()
	added := mustAdded(ctx, t, tx, opts)
	var b strings.Builder
	for i := range max(len(want), len(added)) {
		switch {
		case i >= len(added):
			fmt.Fprintf(&b, "  [%d] missing: want %s\n", i, want[i])
		case i >= len(want):
			fmt.Fprintf(&b, "  [%d] unexpected: %s\n", i, format(added[i]))
		default:
			if d := want[i].diff(added[i]); len(d) > 0 {
				fmt.Fprintf(&b, "  [%d] %s\n      differs: %s\n", i, format(added[i]), strings.Join(d, "; "))
			}
		}
	}
	if b.Len() > 0 {
		t.Errorf("outboxtest: the transaction added %d messages, want %d as listed\n%s", len(added), len(want), b.String())
		t.FailNow()
	}
	return added
}

// RequireNotAdded asserts that no message tx added matches notWant. An empty Expect matches
// every message: RequireNotAdded(ctx, t, tx, Expect{}, nil) asserts that tx added nothing.
func RequireNotAdded(ctx context.Context, t TB, tx outbox.DBTX, notWant Expect, opts *Options) {
	t.Helper()
	added := mustAdded(ctx, t, tx, opts)
	var b strings.Builder
	for i, m := range added {
		if len(notWant.diff(m)) == 0 {
			fmt.Fprintf(&b, "  [%d] %s\n", i, format(m))
		}
	}
	if b.Len() > 0 {
		t.Errorf("outboxtest: the transaction added messages it should not have\n  not want: %s\n%s", notWant, b.String())
		t.FailNow()
	}
}

func mustAdded(ctx context.Context, t TB, tx outbox.DBTX, opts *Options) []outbox.Message {
	t.Helper()
	added, err := Added(ctx, tx, opts)
	if err != nil {
		t.Errorf("%v", err)
		t.FailNow()
	}
	return added
}

// diff lists how m differs from e, one entry per field; empty when m matches.
func (e Expect) diff(m outbox.Message) []string {
	var d []string
	if e.ID != uuid.Nil && e.ID != m.ID {
		d = append(d, fmt.Sprintf("id: want %s, got %s", e.ID, m.ID))
	}
	for _, f := range [...]struct{ name, want, got string }{
		{"type", e.Type, m.Type},
		{"exchange", e.Exchange, m.Exchange},
		{"routing_key", e.RoutingKey, m.RoutingKey},
		{"aggregate_type", e.AggregateType, m.AggregateType},
		{"aggregate_id", e.AggregateID, m.AggregateID},
	} {
		if f.want != "" && f.want != f.got {
			d = append(d, fmt.Sprintf("%s: want %q, got %q", f.name, f.want, f.got))
		}
	}
	if e.Payload != nil {
		want, err := e.payload()
		switch {
		case err != nil:
			d = append(d, fmt.Sprintf("payload: the expected payload is not JSON: %v", err))
		case !jsonEqual(want, m.Payload):
			d = append(d, fmt.Sprintf("payload: want %s, got %s", compact(want), compact(m.Payload)))
		}
	}
	for _, k := range sortedKeys(e.Headers) {
		got, ok := m.Headers[k]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("header %q: want %q, missing", k, e.Headers[k]))
		case got != e.Headers[k]:
			d = append(d, fmt.Sprintf("header %q: want %q, got %q", k, e.Headers[k], got))
		}
	}
	return d
}

// payload returns e.Payload as JSON text.
func (e Expect) payload() ([]byte, error) {
	var text []byte
	switch p := e.Payload.(type) {
	case json.RawMessage:
		text = p
	case []byte:
		text = p
	default:
		return json.Marshal(p)
	}
	if !json.Valid(text) {
		return nil, fmt.Errorf("invalid JSON %q", text)
	}
	return text, nil
}

// String describes the fields e sets, for failure messages.
func (e Expect) String() string {
	var parts []string
	if e.ID != uuid.Nil {
		parts = append(parts, "id="+e.ID.String())
	}
	for _, f := range [...]struct{ name, value string }{
		{"type", e.Type}, {"exchange", e.Exchange}, {"routing_key", e.RoutingKey},
		{"aggregate_type", e.AggregateType}, {"aggregate_id", e.AggregateID},
	} {
		if f.value != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", f.name, f.value))
		}
	}
	if e.Payload != nil {
		if p, err := e.payload(); err == nil {
			parts = append(parts, "payload="+compact(p))
		} else {
			parts = append(parts, fmt.Sprintf("payload=%#v (not JSON: %v)", e.Payload, err))
		}
	}
	if len(e.Headers) > 0 {
		parts = append(parts, "headers⊇"+formatHeaders(e.Headers))
	}
	if len(parts) == 0 {
		return "any message"
	}
	return strings.Join(parts, " ")
}

// describe lists the messages added and how each differs from want.
func describe(added []outbox.Message, want Expect) string {
	if len(added) == 0 {
		return "  the transaction added no message"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  the transaction added %d:\n", len(added))
	for i, m := range added {
		fmt.Fprintf(&b, "  [%d] %s\n", i, format(m))
		if d := want.diff(m); len(d) > 0 {
			fmt.Fprintf(&b, "      differs: %s\n", strings.Join(d, "; "))
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// format describes m on one line.
func format(m outbox.Message) string {
	return fmt.Sprintf("type=%q exchange=%q routing_key=%q aggregate=%s/%s payload=%s headers=%s",
		m.Type, m.Exchange, m.RoutingKey, m.AggregateType, m.AggregateID, compact(m.Payload), formatHeaders(m.Headers))
}

func formatHeaders(h map[string]string) string {
	parts := make([]string, 0, len(h))
	for _, k := range sortedKeys(h) {
		parts = append(parts, fmt.Sprintf("%q:%q", k, h[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func sortedKeys(h map[string]string) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// jsonEqual reports whether a and b are JSON texts of equal values; numbers are compared
// by their text, so that large integers keep their precision.
func jsonEqual(a, b []byte) bool {
	va, errA := decode(a)
	vb, errB := decode(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

func decode(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// compact returns data without insignificant white space, or as it is when not JSON.
func compact(data []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return string(data)
	}
	return b.String()
}
