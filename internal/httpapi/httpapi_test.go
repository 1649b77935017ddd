package httpapi_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/input"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func requireKind(t *testing.T, err error, kind input.Kind) {
	t.Helper()
	var e *input.Error
	require.True(t, errors.As(err, &e), "%T %v", err, err)
	require.Equal(t, kind, e.Kind, "%v", err)
	require.NotEmpty(t, e.Message)
}

func TestReadJSON(t *testing.T) {
	t.Parallel()
	const limit = 32
	read := func(contentType string, body io.Reader) ([]byte, error) {
		r := httptest.NewRequest(http.MethodPost, "/", body)
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		return httpapi.ReadJSON(httptest.NewRecorder(), r, limit)
	}

	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; charset=UTF-8"} {
		data, err := read(ct, strings.NewReader(`{"a":1}`))
		require.NoError(t, err, ct)
		require.Equal(t, `{"a":1}`, string(data))
	}
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/json; =",
		"application/json; charset=latin1", "application/json; charset=utf-16", "application/merge-patch+json"} {
		_, err := read(ct, strings.NewReader(`{}`))
		requireKind(t, err, input.UnsupportedMediaType)
	}
	_, err := read("application/json", strings.NewReader(strings.Repeat(" ", limit+1)))
	requireKind(t, err, input.TooLarge)
	_, err = read("application/json", struct{ io.Reader }{strings.NewReader(strings.Repeat(" ", limit+1))}) // no Content-Length
	requireKind(t, err, input.TooLarge)
	data, err := read("application/json", strings.NewReader(strings.Repeat(" ", limit)))
	require.NoError(t, err, "the limit is inclusive")
	require.Len(t, data, limit)

	t.Run("DecodeJSON applies the input policy", func(t *testing.T) {
		t.Parallel()
		var v struct {
			A int `json:"a"`
		}
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1,"a":2}`))
		r.Header.Set("Content-Type", "application/json")
		requireKind(t, httpapi.DecodeJSON(httptest.NewRecorder(), r, limit, &v), input.Malformed)
	})
}

func TestToken(t *testing.T) {
	t.Parallel()
	req := func(values ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		for _, v := range values {
			r.Header.Add("Idempotency-Key", v)
		}
		return r
	}
	_, ok, err := httpapi.Token(req(), "Idempotency-Key", 8)
	require.NoError(t, err)
	require.False(t, ok)
	v, ok, err := httpapi.Token(req("k-1~!"), "Idempotency-Key", 8)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "k-1~!", v)
	for _, bad := range [][]string{{""}, {"a", "b"}, {"123456789"}, {"k\xff\xfe"}, {"a b"}, {"é"}, {"nul\x00"}, {"tab\t"}} {
		_, _, err := httpapi.Token(req(bad...), "Idempotency-Key", 8)
		requireKind(t, err, input.BadHeader)
	}
	_, _, err = httpapi.Token(req("ééééé"), "Idempotency-Key", 8)
	require.ErrorContains(t, err, "8 bytes", "the limit is in bytes, and says so")
}

func TestWithRequestID(t *testing.T) {
	t.Parallel()
	h := httpapi.WithRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, httpapi.RequestID(r.Context()))
	}))
	serve := func(id string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if id != "" {
			r.Header.Set(httpapi.HeaderRequestID, id)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	rec := serve("req-42")
	require.Equal(t, "req-42", rec.Header().Get(httpapi.HeaderRequestID))
	require.Equal(t, "req-42", rec.Body.String())
	for _, bad := range []string{"", strings.Repeat("r", httpapi.MaxRequestIDBytes+1), "has space", "bad\x7f"} {
		rec := serve(bad)
		_, err := uuid.Parse(rec.Header().Get(httpapi.HeaderRequestID))
		require.NoError(t, err, "%q is replaced by a new id", bad)
		require.Equal(t, rec.Header().Get(httpapi.HeaderRequestID), rec.Body.String())
	}
}

func TestSetAllow(t *testing.T) {
	t.Parallel()
	r := chi.NewRouter()
	r.Use(middleware.GetHead)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		httpapi.SetAllow(w, r)
		w.WriteHeader(http.StatusMethodNotAllowed)
	})
	ok := func(http.ResponseWriter, *http.Request) {}
	r.Get("/items/{id}", ok)
	r.Put("/items/{id}", ok)
	r.Post("/items", ok)
	r.Post("/items/{id}/cancel", ok)

	for path, want := range map[string][]string{
		"/items/42":        {"GET", "HEAD", "PUT"},
		"/items":           {"POST"},
		"/items/42/cancel": {"POST"},
	} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, path, nil))
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code, path)
		require.Equal(t, want, rec.Header().Values("Allow"), path)
	}
}
