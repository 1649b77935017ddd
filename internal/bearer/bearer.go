// Package bearer guards HTTP routes with a bearer token (RFC 6750): the routes an operator
// uses to change data by hand, such as the warehouse's PUT /stock/{sku}, answer only a
// request that sends
//
//	Authorization: Bearer <token>
//
// with the token the service was configured with. Wrap those routes with [Guard.Require]
// (chi: r.With(guard.Require).Put(…)); the rest of the API stays open.
//
// # Answers
//
// Every refusal is an *apperr.Error handed to [Config.Error] (a service's httpapi.Edge.Error),
// so it is a problem document like the service's other errors:
//
//   - no Authorization header, or one that is not a bearer token: 401 (apperr.CodeUnauthorized)
//     with WWW-Authenticate: Bearer realm="…";
//   - a bearer token that is not the configured one: 401 with
//     WWW-Authenticate: Bearer realm="…", error="invalid_token";
//   - no token configured: 403 (apperr.CodeForbidden) with [Config.Disabled] as the detail,
//     whatever the request sends. Routes that change data are closed until an operator
//     opens them, never open by default.
//
// # Secrecy
//
// A Guard keeps the SHA-256 digest of the token, not the token, and compares the digest of
// what a request sends with it in constant time (crypto/subtle): neither the content nor the
// length of the token leaks through the time an answer takes. No answer, error or log line
// of this package contains the token or what the request sent. [Check] tells a token too
// short or unfit for a header apart without quoting it; a service calls it from its
// configuration's Validate.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/problem"
)

// MinLength is the shortest token [Check] accepts, in bytes: 16 random characters are more
// than anyone guesses over HTTP.
const MinLength = 16

// maxLength bounds what a request's Authorization header may carry before it is refused
// unread: no configured token is that long.
const maxLength = 4096

// Check reports whether token can be configured: at least [MinLength] bytes, each a
// character of RFC 6750's b64token (letters, digits and - . _ ~ + /, with = only at the end),
// so that it goes into an Authorization header as it is. The error names the rule, never the
// token.
func Check(token string) error {
	if len(token) < MinLength {
		return fmt.Errorf("must be at least %d bytes long, is %d", MinLength, len(token))
	}
	if len(token) > maxLength {
		return fmt.Errorf("must be at most %d bytes long, is %d", maxLength, len(token))
	}
	if !isB64Token(token) {
		return fmt.Errorf("must be letters, digits and - . _ ~ + / (with = only at the end): no spaces, quotes or other characters")
	}
	return nil
}

// isB64Token reports whether s is a b64token (RFC 6750, section 2.1):
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isB64Token(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := range len(body) {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == '+', c == '/':
		default:
			return false
		}
	}
	return true
}

// Config configures [New].
type Config struct {
	// Token is what a request must send. Empty disables the guarded routes: every request
	// is refused with 403. The caller checks it first ([Check]); New does not.
	Token string
	// Realm names the protection space in WWW-Authenticate ("warehouse-admin").
	Realm string
	// Disabled is the detail of the 403 answered when Token is empty: what to set to open
	// the routes.
	Disabled string
	// Error answers a refusal (an *apperr.Error): the service's httpapi.Edge.Error. nil
	// writes the problem document of problem.Shared(), without logging.
	Error func(w http.ResponseWriter, r *http.Request, err error)
}

// Guard requires the configured bearer token on the routes it wraps.
type Guard struct {
	digest   [sha256.Size]byte
	enabled  bool
	realm    string
	disabled string
	fail     func(http.ResponseWriter, *http.Request, error)
}

// New returns a Guard for cfg. It keeps the token's digest only.
func New(cfg Config) *Guard {
	g := &Guard{enabled: cfg.Token != "", realm: cfg.Realm, disabled: cfg.Disabled, fail: cfg.Error}
	if g.enabled {
		g.digest = sha256.Sum256([]byte(cfg.Token))
	}
	if g.disabled == "" {
		g.disabled = "These routes are disabled: no token is configured."
	}
	if g.fail == nil {
		g.fail = func(w http.ResponseWriter, r *http.Request, err error) {
			problem.Write(w, r, problem.Shared().Details(err))
		}
	}
	return g
}

// Enabled reports whether a token is configured (the guarded routes can be used at all).
func (g *Guard) Enabled() bool { return g.enabled }

// Require is middleware that lets a request through only with the configured token (see the
// package documentation for the refusals).
func (g *Guard) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := g.authorize(w, r); err != nil {
			g.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorize returns nil when r carries the token, else the refusal, with WWW-Authenticate
// set on w for a 401.
func (g *Guard) authorize(w http.ResponseWriter, r *http.Request) error {
	if !g.enabled {
		return apperr.Errorf(apperr.CodeForbidden, "%s", g.disabled)
	}
	challenge := fmt.Sprintf("Bearer realm=%q", g.realm)
	token, ok := credentials(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", challenge)
		return apperr.Errorf(apperr.CodeUnauthorized, "Send the admin token as Authorization: Bearer <token>.")
	}
	sent := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sent[:], g.digest[:]) != 1 {
		w.Header().Set("WWW-Authenticate", challenge+`, error="invalid_token", error_description="the token is not the one configured"`)
		return apperr.Errorf(apperr.CodeUnauthorized, "The bearer token is not the one configured.")
	}
	return nil
}

// credentials returns the token of r's one Authorization header when it is a bearer token
// (the scheme in any case, then one or more spaces, then a b64token), and false otherwise.
func credentials(r *http.Request) (string, bool) {
	values := r.Header.Values("Authorization")
	if len(values) != 1 || len(values[0]) > maxLength {
		return "", false
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	if !isB64Token(token) {
		return "", false
	}
	return token, true
}
