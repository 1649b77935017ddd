package input

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// MaxDepth is how deeply objects and arrays may nest in a body DecodeJSON accepts.
const MaxDepth = 32

// DecodeOptions tune [DecodeJSON].
type DecodeOptions struct {
	// AllowUnknownFields ignores members that name no field of the target, as a consumer of
	// events does (adding a field is not a new version). A member that names a field in
	// another case ("ORDER_ID") is refused all the same: encoding/json would decode it into
	// that field.
	AllowUnknownFields bool
}

// DecodeJSON decodes data, which must be one JSON object, into v (a pointer to a struct or a
// map with string keys) under the package's policy, and returns an *Error when data breaks
// it:
//
//   - Malformed: data is empty, not valid UTF-8, not valid JSON, not an object, followed by
//     anything but white space, nested more than MaxDepth levels, or has a duplicate member
//     name, a member that names no field (unless opts.AllowUnknownFields) or names one in
//     another case, or a lone UTF-16 surrogate escape;
//   - Invalid, with one FieldError per field: a value of the wrong JSON type, a number that
//     is not an integer (or out of range) where an integer is expected, a string with NUL
//     (which PostgreSQL cannot store), a string a field's UnmarshalText refuses.
//
// v is only written when data is accepted.
func DecodeJSON(data []byte, v any, opts DecodeOptions) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic(fmt.Sprintf("input.DecodeJSON: want a non-nil pointer, got %T", v))
	}
	root := schemaOf(rv.Type().Elem())
	if root.kind != kObject && root.kind != kMap {
		panic(fmt.Sprintf("input.DecodeJSON: want a pointer to a struct or a map, got %T", v))
	}
	if i := invalidUTF8(data); i >= 0 {
		return Errorf(Malformed, "The body is not valid UTF-8 (bad byte at offset %d).", i)
	}
	w := walker{dec: json.NewDecoder(bytes.NewReader(data)), opts: opts}
	w.dec.UseNumber()
	tok, err := w.dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if tok != json.Delim('{') {
		return Errorf(Malformed, "The body must be a JSON object, not %s.", tokenKind(tok))
	}
	if err := w.object(root, ""); err != nil {
		return err
	}
	if _, err := w.dec.Token(); !errors.Is(err, io.EOF) {
		return Errorf(Malformed, "The body must hold one JSON object and nothing after it.")
	}
	if off, esc := loneSurrogate(data); off >= 0 {
		return Errorf(Malformed, "The body has a lone UTF-16 surrogate escape (%s at byte %d), which is no character.", esc, off)
	}
	if len(w.fields) > 0 {
		return &Error{Kind: Invalid, Message: "Fields have values of the wrong type; see errors.", Fields: w.fields}
	}
	if err := json.Unmarshal(data, v); err != nil {
		// Only a field's own UnmarshalJSON can fail here: the walk checked everything else.
		return &Error{Kind: Malformed, Message: "The body could not be decoded.", Err: err}
	}
	return nil
}

func invalidUTF8(data []byte) int {
	if utf8.Valid(data) {
		return -1
	}
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

func syntaxError(err error) *Error {
	if syn, ok := errors.AsType[*json.SyntaxError](err); ok {
		return &Error{Kind: Malformed, Err: err,
			Message: fmt.Sprintf("The body is not valid JSON (at byte %d): %s.", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))}
	}
	if errors.Is(err, io.EOF) {
		return &Error{Kind: Malformed, Err: err, Message: "The body is empty; it must be a JSON object."}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return &Error{Kind: Malformed, Err: err, Message: "The body ends in the middle of a JSON value."}
	}
	return &Error{Kind: Malformed, Err: err, Message: "The body is not valid JSON."}
}

// tokenKind names the JSON kind of a token, for messages.
func tokenKind(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// nodeKind is what JSON a schema node accepts.
type nodeKind int

const (
	kAny    nodeKind = iota // any value (interface{}, json.RawMessage, a json.Unmarshaler)
	kObject                 // a struct: an object with exactly its fields
	kMap                    // a map: an object with any member names
	kArray
	kString
	kText // an encoding.TextUnmarshaler: a string it accepts
	kInt
	kUint
	kFloat
	kBool
)

// node is the schema of a Go type as JSON: what DecodeJSON's walk checks.
type node struct {
	kind   nodeKind
	fields map[string]*node // kObject: by JSON name, exactly
	elem   *node            // kArray, kMap
	typ    reflect.Type     // kText, kInt, kUint: the type itself
}

var (
	anyNode = &node{kind: kAny}
	schemas sync.Map // reflect.Type → *node
)

var (
	rawMessageType       = reflect.TypeFor[json.RawMessage]()
	jsonUnmarshalerType  = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType  = reflect.TypeFor[encoding.TextUnmarshaler]()
	byteSliceElementType = reflect.TypeFor[byte]()
)

func schemaOf(t reflect.Type) *node {
	if n, ok := schemas.Load(t); ok {
		return n.(*node)
	}
	n := build(t, map[reflect.Type]*node{})
	schemas.Store(t, n)
	return n
}

// build returns the schema of t; seen breaks the cycles of recursive types.
func build(t reflect.Type, seen map[reflect.Type]*node) *node {
	if n, ok := seen[t]; ok {
		return n
	}
	switch {
	case t == rawMessageType:
		return anyNode
	case t.Kind() == reflect.Pointer:
		return build(t.Elem(), seen)
	case reflect.PointerTo(t).Implements(jsonUnmarshalerType):
		return anyNode
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		return &node{kind: kText, typ: t}
	}
	switch t.Kind() {
	case reflect.Struct:
		n := &node{kind: kObject, fields: map[string]*node{}}
		seen[t] = n
		addFields(n, t, seen)
		return n
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return anyNode
		}
		n := &node{kind: kMap}
		seen[t] = n
		n.elem = build(t.Elem(), seen)
		return n
	case reflect.Slice, reflect.Array:
		if t.Elem() == byteSliceElementType {
			return &node{kind: kString} // base64
		}
		n := &node{kind: kArray}
		seen[t] = n
		n.elem = build(t.Elem(), seen)
		return n
	case reflect.String:
		return &node{kind: kString}
	case reflect.Bool:
		return &node{kind: kBool}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return &node{kind: kInt, typ: t}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &node{kind: kUint, typ: t}
	case reflect.Float32, reflect.Float64:
		return &node{kind: kFloat}
	}
	return anyNode
}

// addFields adds the JSON fields of struct t to n, as encoding/json names them: the json tag's
// name, else the Go name; embedded structs without a name contribute their fields.
func addFields(n *node, t reflect.Type, seen map[reflect.Type]*node) {
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				addFields(n, ft, seen)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		child := build(f.Type, seen)
		if strings.Contains(","+opts+",", ",string,") {
			child = anyNode // a number or boolean quoted as a string: left to encoding/json
		}
		n.fields[name] = child
	}
}

// walker checks a body token by token against a schema.
type walker struct {
	dec    *json.Decoder
	opts   DecodeOptions
	depth  int
	fields []FieldError
}

func (w *walker) fieldError(path, format string, args ...any) {
	w.fields = append(w.fields, FieldError{Field: path, Message: fmt.Sprintf(format, args...)})
}

// object reads the members of an object whose '{' was read, up to its '}'.
func (w *walker) object(n *node, path string) error {
	if w.depth++; w.depth > MaxDepth {
		return Errorf(Malformed, "The body nests objects and arrays more than %d levels deep.", MaxDepth)
	}
	defer func() { w.depth-- }()
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		key := tok.(string) // json.Decoder only returns strings in key position
		field := joinField(path, key)
		if seen[key] {
			return Errorf(Malformed, "Member %q appears more than once.", field)
		}
		seen[key] = true
		child := anyNode
		switch n.kind {
		case kMap:
			child = n.elem
		case kObject:
			f, ok := n.fields[key]
			switch {
			case ok:
				child = f
			case foldMatch(n, key) != "":
				return Errorf(Malformed, "Unknown field %q: field names are case-sensitive (%q).", field, joinField(path, foldMatch(n, key)))
			case !w.opts.AllowUnknownFields:
				return Errorf(Malformed, "Unknown field %q.", field)
			}
		}
		if err := w.value(child, field); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // '}'
		return syntaxError(err)
	}
	return nil
}

// foldMatch returns the field of n that key names in another case, or "".
func foldMatch(n *node, key string) string {
	for name := range n.fields {
		if strings.EqualFold(name, key) {
			return name
		}
	}
	return ""
}

func joinField(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// value reads one value and checks it against n.
func (w *walker) value(n *node, path string) error {
	tok, err := w.dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if tok == nil {
		return nil // null leaves a Go value as it is, for every type
	}
	want := n.kind
	switch t := tok.(type) {
	case json.Delim:
		switch {
		case t == '{' && (want == kObject || want == kMap || want == kAny):
			return w.object(n, path)
		case t == '[' && (want == kArray || want == kAny):
			return w.array(n, path)
		}
		w.mismatch(n, path, tok)
		if t == '{' {
			return w.object(anyNode, path) // still checked for duplicates and syntax
		}
		return w.array(anyNode, path)
	case string:
		switch want {
		case kString, kAny:
		case kText:
			if err := reflect.New(n.typ).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(t)); err != nil {
				w.fieldError(path, "is not valid: %v", err)
				return nil
			}
		default:
			w.mismatch(n, path, tok)
			return nil
		}
		if i := strings.IndexByte(t, 0); i >= 0 {
			w.fieldError(path, "must not contain NUL (at offset %d)", i)
		}
	case json.Number:
		switch want {
		case kInt:
			if _, err := strconv.ParseInt(t.String(), 10, n.typ.Bits()); err != nil {
				w.integerError(n, path, t)
			}
		case kUint:
			if _, err := strconv.ParseUint(t.String(), 10, n.typ.Bits()); err != nil {
				w.integerError(n, path, t)
			}
		case kFloat, kAny:
		default:
			w.mismatch(n, path, tok)
		}
	case bool:
		if want != kBool && want != kAny {
			w.mismatch(n, path, tok)
		}
	}
	return nil
}

// array reads the elements of an array whose '[' was read, up to its ']'.
func (w *walker) array(n *node, path string) error {
	if w.depth++; w.depth > MaxDepth {
		return Errorf(Malformed, "The body nests objects and arrays more than %d levels deep.", MaxDepth)
	}
	defer func() { w.depth-- }()
	elem := anyNode
	if n.kind == kArray {
		elem = n.elem
	}
	for i := 0; w.dec.More(); i++ {
		if err := w.value(elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // ']'
		return syntaxError(err)
	}
	return nil
}

func (w *walker) mismatch(n *node, path string, got json.Token) {
	var want string
	switch n.kind {
	case kObject, kMap:
		want = "an object"
	case kArray:
		want = "an array"
	case kString, kText:
		want = "a string"
	case kInt, kUint:
		want = "an integer"
	case kFloat:
		want = "a number"
	case kBool:
		want = "true or false"
	}
	w.fieldError(path, "must be %s, not %s", want, tokenKind(got))
}

func (w *walker) integerError(n *node, path string, num json.Number) {
	s := num.String()
	if strings.ContainsAny(s, ".eE") {
		w.fieldError(path, "must be an integer, not %s", s)
		return
	}
	bits := n.typ.Bits()
	if n.kind == kUint {
		w.fieldError(path, "must be an integer from 0 to %d", uint64(math.MaxUint64)>>(64-bits))
		return
	}
	w.fieldError(path, "must be an integer from %d to %d", int64(-1)<<(bits-1), int64(math.MaxInt64)>>(64-bits))
}

// loneSurrogate returns the offset and text of the first \uXXXX escape in data's strings
// that is a UTF-16 surrogate without its other half (encoding/json would decode it as
// U+FFFD), or -1. data is valid JSON.
func loneSurrogate(data []byte) (int, string) {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if data[i+1] != 'u' {
				i++ // \" \\ \/ \b \f \n \r \t
				continue
			}
			r := hex4(data[i+2 : i+6])
			switch {
			case r >= 0xdc00 && r <= 0xdfff: // a low half first
				return i, string(data[i : i+6])
			case r >= 0xd800 && r <= 0xdbff:
				if i+12 > len(data) || data[i+6] != '\\' || data[i+7] != 'u' {
					return i, string(data[i : i+6])
				}
				if lo := hex4(data[i+8 : i+12]); lo < 0xdc00 || lo > 0xdfff {
					return i, string(data[i : i+6])
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return -1, ""
}

// hex4 reads four hexadecimal digits, which valid JSON guarantees after \u.
func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(v)
}
