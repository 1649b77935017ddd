package envconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
)

// Redacted is what a set [Secret] shows wherever it is printed, logged or marshalled.
const Redacted = "[redacted]"

// Secret is a setting that must never be shown: a token, a password. It formats (with any
// verb, %#v included), logs (slog.LogValuer) and marshals (JSON, text) as [Redacted], or as
// "" when unset, so that a Config printed whole in a log line or an error leaks nothing.
// [Secret.Reveal] is the one way to the value, for the code that uses it.
//
// A Secret field reads its variable like a string field does (caarlos0/env parses by the
// kind of the field).
type Secret string

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String returns [Redacted], or "" for an unset secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return Redacted
}

// GoString is String: %#v shows no more than %v.
func (s Secret) GoString() string { return s.String() }

// Format implements fmt.Formatter, so that every verb (%x and %q too) prints String.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = fmt.Fprint(f, s.String()) }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler (and so JSON) with String.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// SecretFromFile applies the *_FILE convention of the official container images to a secret
// setting: the secret is either the value of the variable valueVar, or the content of the
// file fileVar names (path), with its trailing newlines trimmed, so that a mounted
// Kubernetes Secret or a compose secret works as it is. Both set is an error naming both;
// neither returns "" (the caller decides whether that is allowed). A file that cannot be
// read, or that is empty, is an error naming fileVar and path, never the content.
func SecretFromFile(value Secret, valueVar, path, fileVar string) (Secret, error) {
	switch {
	case value != "" && path != "":
		return "", fmt.Errorf("%s and %s are both set: set one of them", valueVar, fileVar)
	case path == "":
		return value, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		// The *PathError already says the path; name the variable, and keep the cause
		// without repeating the path.
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err
		}
		return "", fmt.Errorf("%s: cannot read %s: %w", fileVar, path, err)
	}
	secret := strings.TrimRight(string(data), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("%s: %s is empty", fileVar, path)
	}
	return Secret(secret), nil
}
