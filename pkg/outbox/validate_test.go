package outbox_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func validMessage() outbox.Message {
	return outbox.Message{
		Exchange: "shop.events", RoutingKey: "order.created", Type: "OrderCreated",
		AggregateType: "order", AggregateID: "o-1", Payload: json.RawMessage(`{"n":1}`),
		Headers: map[string]string{outbox.HeaderCorrelationID: "c-1"},
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()

	t.Run("Refuses", func(t *testing.T) {
		t.Parallel()
		for name, c := range map[string]struct {
			mutate func(m *outbox.Message)
			field  string
		}{
			"EmptyType":              {func(m *outbox.Message) { m.Type = "" }, "Type is empty"},
			"EmptyAggregateType":     {func(m *outbox.Message) { m.AggregateType = "" }, "AggregateType is empty"},
			"NoDestination":          {func(m *outbox.Message) { m.Exchange, m.RoutingKey = "", "" }, "no destination"},
			"LongExchange":           {func(m *outbox.Message) { m.Exchange = strings.Repeat("e", 256) }, "Exchange is 256 bytes"},
			"LongRoutingKey":         {func(m *outbox.Message) { m.RoutingKey = strings.Repeat("r", 300) }, "RoutingKey is 300 bytes"},
			"LongTypeInRunes":        {func(m *outbox.Message) { m.Type = strings.Repeat("é", 128) }, "Type is 256 bytes"}, // 128 runes, 256 bytes
			"LongHeaderName":         {func(m *outbox.Message) { m.Headers = map[string]string{strings.Repeat("h", 256): ""} }, "header name"},
			"LongCorrelationID":      {func(m *outbox.Message) { m.Headers[outbox.HeaderCorrelationID] = strings.Repeat("c", 256) }, `header "correlation_id" is 256 bytes`},
			"ReservedAggregateType":  {func(m *outbox.Message) { m.Headers[outbox.HeaderAggregateType] = "x" }, `header name "aggregate_type" is reserved`},
			"ReservedCC":             {func(m *outbox.Message) { m.Headers["CC"] = "q" }, `header name "CC" is reserved`},
			"InvalidUTF8Exchange":    {func(m *outbox.Message) { m.Exchange = "ex\xff" }, "Exchange is not valid UTF-8"},
			"InvalidUTF8AggregateID": {func(m *outbox.Message) { m.AggregateID = "\xed\xa0\x80" }, "AggregateID is not valid UTF-8"}, // a surrogate
			"NULAggregateType":       {func(m *outbox.Message) { m.AggregateType = "a\x00" }, "AggregateType contains a NUL byte"},
			"NULHeaderName":          {func(m *outbox.Message) { m.Headers["a\x00"] = "" }, "contains a NUL byte"},
			"InvalidUTF8HeaderValue": {func(m *outbox.Message) { m.Headers["h"] = "\x80" }, `header "h" is not valid UTF-8`},
			"HeadersTooLarge": {func(m *outbox.Message) {
				m.Headers["big"] = strings.Repeat("b", outbox.MaxHeaderBytes)
			}, "Headers take"},
			"EmptyPayload":           {func(m *outbox.Message) { m.Payload = nil }, "Payload is empty"},
			"PayloadNotJSON":         {func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":1`) }, "Payload is not valid JSON"},
			"PayloadTrailingGarbage": {func(m *outbox.Message) { m.Payload = json.RawMessage(`{} {}`) }, "Payload is not valid JSON"},
			// encoding/json accepts invalid UTF-8 inside strings; PostgreSQL does not.
			"PayloadInvalidUTF8InString": {func(m *outbox.Message) { m.Payload = json.RawMessage("{\"a\":\"\xc0\xaf\"}") }, "Payload is not valid UTF-8"},
		} {
			t.Run(name, func(t *testing.T) {
				m := validMessage()
				c.mutate(&m)
				err := m.Validate()
				require.ErrorIs(t, err, outbox.ErrInvalidMessage)
				require.ErrorContains(t, err, c.field)
			})
		}
	})

	t.Run("AcceptsTheLimits", func(t *testing.T) {
		t.Parallel()
		for name, mutate := range map[string]func(m *outbox.Message){
			"ShortStringsOf255Bytes": func(m *outbox.Message) {
				m.Exchange, m.RoutingKey, m.Type = strings.Repeat("e", 255), strings.Repeat("r", 255), strings.Repeat("t", 255)
				m.Headers = map[string]string{strings.Repeat("h", 255): "", outbox.HeaderCorrelationID: strings.Repeat("c", 255)}
			},
			"OnlyAnExchange":  func(m *outbox.Message) { m.RoutingKey = "" },
			"OnlyARoutingKey": func(m *outbox.Message) { m.Exchange = "" },
			"NoHeaders":       func(m *outbox.Message) { m.Headers = nil },
			"LongHeaderValue": func(m *outbox.Message) { m.Headers["v"] = strings.Repeat("v", 60_000) },
			"LongAggregateID": func(m *outbox.Message) { m.AggregateID = strings.Repeat("a", 1000) },
			"HeadersAtTheLimit": func(m *outbox.Message) {
				m.Headers["pad"] = ""
				m.Headers["pad"] = strings.Repeat("p", outbox.MaxHeaderBytes-m.HeaderBytes())
			},
			// The JSON escape is valid JSON: stored verbatim in a json column.
			"EscapedNULInPayload": func(m *outbox.Message) { m.Payload = json.RawMessage(`{"s":"a\u0000b"}`) },
			"UnicodeEverywhere": func(m *outbox.Message) {
				m.AggregateID, m.Type, m.Payload = "commande-é", "CommandeCréée", json.RawMessage(`{"ville":"Zürich 🏔"}`)
			},
			"PayloadNotAnObject": func(m *outbox.Message) { m.Payload = json.RawMessage(` "just a string" `) },
		} {
			t.Run(name, func(t *testing.T) {
				m := validMessage()
				mutate(&m)
				require.NoError(t, m.Validate())
			})
		}
	})

	t.Run("HeaderBytesIsTheAMQPEncoding", func(t *testing.T) {
		t.Parallel()
		m := validMessage()
		m.AggregateType, m.AggregateID = "order", "o-1"
		m.Headers = map[string]string{"ab": "xyz"}
		// 4 (table length) + each entry: 1 + name + 1 ('S') + 4 + value.
		want := 4 + (1 + 2 + 1 + 4 + 3) + (1 + len("aggregate_type") + 1 + 4 + 5) + (1 + len("aggregate_id") + 1 + 4 + 3)
		require.Equal(t, want, m.HeaderBytes())
	})
}

// FuzzValidate checks that a message Validate accepts can be stored and published as given:
// text PostgreSQL takes, short strings AMQP takes, headers that survive JSON unchanged.
func FuzzValidate(f *testing.F) {
	f.Add("shop.events", "order.created", "OrderCreated", "o-1", "correlation_id", "c-1", []byte(`{"n":1}`))
	f.Add("", "", "", "", "", "", []byte(``))
	f.Add("e\x00", "k", "T", "a\xff", "CC", "x", []byte("{\"a\":\"\xff\"}"))
	f.Add("e", "k", "T", "a", "h", "\u0000", []byte(`{"a":"\u0000"}`))
	f.Fuzz(func(t *testing.T, exchange, key, typ, aggID, hname, hvalue string, payload []byte) {
		m := outbox.Message{Exchange: exchange, RoutingKey: key, Type: typ, AggregateType: "t", AggregateID: aggID,
			Payload: payload, Headers: map[string]string{hname: hvalue}}
		if m.Validate() != nil {
			return
		}
		for _, s := range []string{exchange, key, typ, aggID, hname, hvalue, string(payload)} {
			require.True(t, utf8.ValidString(s))
		}
		for _, s := range []string{exchange, key, typ, aggID, hname, hvalue} {
			require.NotContains(t, s, "\x00")
		}
		for _, s := range []string{exchange, key, typ, hname} {
			require.LessOrEqual(t, len(s), outbox.MaxShortString)
		}
		require.True(t, json.Valid(payload))
		require.LessOrEqual(t, m.HeaderBytes(), outbox.MaxHeaderBytes)
		enc, err := json.Marshal(m.Headers)
		require.NoError(t, err)
		var back map[string]string
		require.NoError(t, json.Unmarshal(enc, &back))
		require.Equal(t, m.Headers, back, "headers survive their JSON column unchanged")
	})
}
