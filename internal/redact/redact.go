// Package redact keeps the secrets of URLs out of error messages and log lines: the passwords
// of the database and broker URLs, which the services read from their configuration and the
// client libraries may quote.
//
// [URLError] is the reason a URL did not parse, without any part of the URL: a password
// written without its percent-encoding (a / or @ in it) splits the URL where the parser does
// not expect it, and the parser's error quotes the piece it stumbled on ("invalid port
// \":S3cr3t\" after host"), a piece of the password. [Text] removes a URL and its password
// from a text that may hold them, such as a client library's error.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Placeholder stands where [Text] removed a secret.
const Placeholder = "xxxxx"

// quoted is a double-quoted string of an error message, with the space before it.
var quoted = regexp.MustCompile(` ?"(?:[^"\\]|\\.)*"`)

// URLError returns the reason err, the error of parsing a URL (url.Parse's, or a client's
// such as amqp.ParseURI's), gives, without the URL (a *url.Error's) or anything the parser
// quoted from it: "invalid port after host", "invalid URL escape". nil stays nil.
func URLError(err error) error {
	if err == nil {
		return nil
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return errors.New(quoted.ReplaceAllString(err.Error(), ""))
}

// Text returns text with rawURL replaced by "<URL>" and each secret, as it is and
// percent-encoded as a URL may carry it, by [Placeholder].
func Text(text, rawURL string, secrets ...string) string {
	if rawURL != "" {
		text = strings.ReplaceAll(text, rawURL, "<URL>")
	}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		userinfo := strings.TrimPrefix(url.UserPassword("u", s).String(), "u:")
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s), userinfo} {
			text = strings.ReplaceAll(text, form, Placeholder)
		}
	}
	return text
}
