package input_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/internal/input"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type line struct {
	SKU      string          `json:"sku"`
	Quantity int32           `json:"quantity"`
	Note     json.RawMessage `json:"note"`
}

type order struct {
	CustomerID string    `json:"customer_id"`
	Items      []line    `json:"items"`
	Count      *uint8    `json:"count"`
	Ratio      float64   `json:"ratio"`
	Express    bool      `json:"express"`
	ID         uuid.UUID `json:"id"`
	Tags       map[string]string
	Ignored    string `json:"-"`
	hidden     string //nolint:unused // unexported fields are not JSON fields
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()

	t.Run("accepts a body that keeps the rules", func(t *testing.T) {
		t.Parallel()
		var o order
		err := input.DecodeJSON([]byte(` {"customer_id":"c-42 \ud83d\ude00 é","items":[{"sku":"A","quantity":2,"note":{"x":[1,{"y":null}]}}],`+
			`"count":3,"ratio":1.5e2,"express":true,"id":"0190a6e8-6c2a-7c3e-9d2f-6f1c2b3a4d5e","Tags":{"k":"v","K":"w"}} `+"\n"), &o, input.DecodeOptions{})
		require.NoError(t, err)
		require.Equal(t, "c-42 😀 é", o.CustomerID)
		require.Equal(t, int32(2), o.Items[0].Quantity)
		require.Equal(t, uint8(3), *o.Count)
		require.Equal(t, 150.0, o.Ratio)
		require.Equal(t, map[string]string{"k": "v", "K": "w"}, o.Tags, "map keys are data, not field names")
	})

	t.Run("leaves null values as they are", func(t *testing.T) {
		t.Parallel()
		var o order
		require.NoError(t, input.DecodeJSON([]byte(`{"customer_id":null,"items":[null],"count":null}`), &o, input.DecodeOptions{}))
		require.Nil(t, o.Count)
	})

	t.Run("allows unknown fields when asked, but never another case", func(t *testing.T) {
		t.Parallel()
		var o order
		require.NoError(t, input.DecodeJSON([]byte(`{"customer_id":"c","extra":{"a":1},"items":[{"sku":"A","more":[1]}]}`), &o,
			input.DecodeOptions{AllowUnknownFields: true}))
		require.Equal(t, "c", o.CustomerID)
		err := input.DecodeJSON([]byte(`{"Customer_ID":"c"}`), &o, input.DecodeOptions{AllowUnknownFields: true})
		requireKind(t, err, input.Malformed)
		require.Contains(t, err.Error(), "case-sensitive")
	})

	for _, tc := range []struct {
		name   string
		body   string
		kind   input.Kind
		fields []string // Invalid only
	}{
		{"Empty", ``, input.Malformed, nil},
		{"WhiteSpace", " \n\t", input.Malformed, nil},
		{"NotJSON", `customer_id=c`, input.Malformed, nil},
		{"Truncated", `{"customer_id":"c","items":[`, input.Malformed, nil},
		{"Null", `null`, input.Malformed, nil},
		{"Array", `[{}]`, input.Malformed, nil},
		{"Number", `12`, input.Malformed, nil},
		{"String", `"x"`, input.Malformed, nil},
		{"TrailingObject", `{}{}`, input.Malformed, nil},
		{"TrailingGarbage", `{} x`, input.Malformed, nil},
		{"InvalidUTF8", "{\"customer_id\":\"k\xff\xfe\"}", input.Malformed, nil},
		{"InvalidUTF8InKey", "{\"c\xc3\":1}", input.Malformed, nil},
		{"Latin1", "{\"customer_id\":\"caf\xe9\"}", input.Malformed, nil},
		{"LoneHighSurrogate", `{"customer_id":"\ud800"}`, input.Malformed, nil},
		{"LoneHighSurrogateBeforeText", `{"customer_id":"\ud800abcdef"}`, input.Malformed, nil},
		{"HighThenNonLow", `{"customer_id":"\ud800\u0041"}`, input.Malformed, nil},
		{"LoneLowSurrogate", `{"customer_id":"\udc00"}`, input.Malformed, nil},
		{"LoneSurrogateInKey", `{"items":[{"sku":"a","note":{"\ud800":1}}]}`, input.Malformed, nil},
		{"LoneSurrogateAtEnd", `{"customer_id":"a\\","ratio":1,"x":"\udbff"}`, input.Malformed, nil},
		{"DuplicateKey", `{"customer_id":"a","customer_id":"b"}`, input.Malformed, nil},
		{"DuplicateNestedKey", `{"items":[{"sku":"a","sku":"b"}]}`, input.Malformed, nil},
		{"DuplicateKeyInRawValue", `{"items":[{"note":{"a":1,"a":2}}]}`, input.Malformed, nil},
		{"DuplicateKeyInMap", `{"Tags":{"a":"1","a":"2"}}`, input.Malformed, nil},
		{"DuplicateKeyByEscape", `{"customer_id":"a","customer\u005fid":"b"}`, input.Malformed, nil},
		{"UnknownField", `{"discount":50}`, input.Malformed, nil},
		{"UnknownNestedField", `{"items":[{"sku":"a","price":0}]}`, input.Malformed, nil},
		{"WrongCase", `{"CUSTOMER_ID":"c"}`, input.Malformed, nil},
		{"WrongCaseNested", `{"items":[{"SKU":"a"}]}`, input.Malformed, nil},
		{"KelvinSign", `{"items":[{"s\u212au":"a"}]}`, input.Malformed, nil},
		{"IgnoredField", `{"Ignored":"x"}`, input.Malformed, nil},
		{"TooDeep", `{"items":[{"note":` + strings.Repeat("[", input.MaxDepth) + strings.Repeat("]", input.MaxDepth) + `}]}`, input.Malformed, nil},
		{"StringForNumber", `{"items":[{"quantity":"1"}]}`, input.Invalid, []string{"items[0].quantity"}},
		{"Fraction", `{"items":[{"quantity":1},{"quantity":1.5}]}`, input.Invalid, []string{"items[1].quantity"}},
		{"Exponent", `{"items":[{"quantity":1e3}]}`, input.Invalid, []string{"items[0].quantity"}},
		{"Overflow", `{"items":[{"quantity":2147483648}]}`, input.Invalid, []string{"items[0].quantity"}},
		{"NegativeUnsigned", `{"count":-1}`, input.Invalid, []string{"count"}},
		{"UnsignedOverflow", `{"count":256}`, input.Invalid, []string{"count"}},
		{"NumberForString", `{"customer_id":42}`, input.Invalid, []string{"customer_id"}},
		{"ObjectForString", `{"customer_id":{"a":1}}`, input.Invalid, []string{"customer_id"}},
		{"ObjectForArray", `{"items":{"sku":"a"}}`, input.Invalid, []string{"items"}},
		{"NumberForObject", `{"items":[1,{"sku":"a"}]}`, input.Invalid, []string{"items[0]"}},
		{"StringForBool", `{"express":"yes"}`, input.Invalid, []string{"express"}},
		{"BoolForFloat", `{"ratio":true}`, input.Invalid, []string{"ratio"}},
		{"NotAUUID", `{"id":"order-1"}`, input.Invalid, []string{"id"}},
		{"NUL", `{"customer_id":"a\u0000b"}`, input.Invalid, []string{"customer_id"}},
		{"NULInRawValue", `{"items":[{"note":"\u0000"}]}`, input.Invalid, []string{"items[0].note"}},
		{"SeveralFields", `{"customer_id":1,"items":[{"sku":2,"quantity":"3"}]}`, input.Invalid, []string{"customer_id", "items[0].sku", "items[0].quantity"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := order{CustomerID: "untouched"}
			err := input.DecodeJSON([]byte(tc.body), &o, input.DecodeOptions{})
			e := requireKind(t, err, tc.kind)
			require.NotEmpty(t, e.Message)
			var fields []string
			for _, f := range e.Fields {
				require.NotEmpty(t, f.Message)
				fields = append(fields, f.Field)
			}
			require.Equal(t, tc.fields, fields)
			require.Equal(t, "untouched", o.CustomerID, "nothing is written on a refusal")
		})
	}

	t.Run("a map target is an object of any names", func(t *testing.T) {
		t.Parallel()
		var m map[string]int
		require.NoError(t, input.DecodeJSON([]byte(`{"a":1,"A":2}`), &m, input.DecodeOptions{}))
		requireKind(t, input.DecodeJSON([]byte(`{"a":"x"}`), &m, input.DecodeOptions{}), input.Invalid)
	})
}

func requireKind(t *testing.T, err error, kind input.Kind) *input.Error {
	t.Helper()
	require.Error(t, err)
	var e *input.Error
	require.True(t, errors.As(err, &e), "%T %v", err, err)
	require.Equal(t, kind, e.Kind, "%v", err)
	return e
}

// FuzzDecodeJSON checks that no body panics the decoder, that every refusal is an *Error,
// and that what it accepts, encoding/json decodes to the same value.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"customer_id":"c","items":[{"sku":"A","quantity":1,"note":[{"a":null}]}]}`,
		`{"customer_id":"\ud83d\ude00"}`, `{"customer_id":"\ud800"}`, `{"customer_id":"\udc00\ud800"}`,
		"{\"customer_id\":\"k\xff\xfe\"}", `{"customer_id":"a","customer_id":"b"}`, `{"Customer_ID":"c"}`,
		`{"customer_id":"\u0000"}`, `{"count":-1}`, `{"items":[{"quantity":1e3}]}`, `{} {}`, `null`, ``,
		`{"Tags":{"a":"1","a":"2"}}`, `{"id":"0190a6e8-6c2a-7c3e-9d2f-6f1c2b3a4d5e"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got order
		err := input.DecodeJSON(body, &got, input.DecodeOptions{})
		if err != nil {
			var e *input.Error
			require.True(t, errors.As(err, &e), "%T %v", err, err)
			require.Contains(t, []input.Kind{input.Malformed, input.Invalid}, e.Kind)
			return
		}
		var want order
		require.NoError(t, json.Unmarshal(body, &want))
		require.Equal(t, want, got)
		require.NotContains(t, got.CustomerID, "\x00")
	})
}

func TestIdentifierProblem(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"c-42", "BOOK-1", "Zoë", "日本", "a b", "😀", "\uFFFD"} {
		require.Empty(t, input.IdentifierProblem(ok), "%q", ok)
	}
	for _, bad := range []string{
		"a\x00b", "\x1b[31m", "tab\there", "new\nline", "del\x7f", "c1\u0085", "c1\u009f",
		"rlo\u202egnp.exe", "lre\u202a", "pdf\u202c", "lri\u2066", "pdi\u2069", "lrm\u200e", "rlm\u200f", "alm\u061c",
		"bad\xffutf8", "\xed\xa0\x80", // a surrogate encoded in UTF-8 is invalid UTF-8
	} {
		require.NotEmpty(t, input.IdentifierProblem(bad), "%q", bad)
	}
}

func TestVisibleASCII(t *testing.T) {
	t.Parallel()
	require.True(t, input.VisibleASCII("k-1_~!", 255))
	require.True(t, input.VisibleASCII(strings.Repeat("k", 255), 255))
	for _, bad := range []string{"", strings.Repeat("k", 256), "has space", "k\xff\xfe", "é", "tab\t", "nul\x00", "del\x7f"} {
		require.False(t, input.VisibleASCII(bad, 255), "%q", bad)
	}
}

func TestParseID(t *testing.T) {
	t.Parallel()
	id := uuid.Must(uuid.NewV7())
	got, ok := input.ParseID(id.String())
	require.True(t, ok)
	require.Equal(t, id, got)
	s := id.String()
	for _, bad := range []string{
		"", "order-1", strings.ToUpper(s), "urn:uuid:" + s, "{" + s + "}", strings.ReplaceAll(s, "-", ""),
		s[:35], s + "0", strings.Replace(s, "-", "x", 1), "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
	} {
		_, ok := input.ParseID(bad)
		require.False(t, ok, "%q", bad)
	}
}
