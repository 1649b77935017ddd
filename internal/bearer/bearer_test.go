package bearer_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/bearer"
	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/problem"
)

const token = "test-admin-token-0123456789abcdef"

type bundle struct {
	handler http.Handler
	logs    *bytes.Buffer
}

// setup returns a router whose PUT /items/{id} is guarded by a Guard with token (none when
// empty), answering refusals through an httpapi.Edge that logs everything, debug included.
func setup(t *testing.T, token string) bundle {
	t.Helper()
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	edge := httpapi.Edge{Problems: problem.Shared(), Logger: log}
	guard := bearer.New(bearer.Config{Token: token, Realm: "test-admin", Disabled: "The admin API is disabled: set TEST_TOKEN.", Error: edge.Error})
	r := edge.NewRouter()
	r.Get("/items/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.With(guard.Require).Put("/items/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return bundle{handler: r, logs: &logs}
}

func (b bundle) do(t *testing.T, method string, authorization ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, "/items/1", nil)
	for _, a := range authorization {
		req.Header.Add("Authorization", a)
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, typ string) problem.Details {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
	var d problem.Details
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	require.Equal(t, status, d.Status)
	require.Equal(t, typ, d.Type)
	return d
}

func TestGuard(t *testing.T) {
	t.Parallel()

	t.Run("TheTokenPasses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, token)
		require.Equal(t, http.StatusNoContent, b.do(t, http.MethodPut, "Bearer "+token).Code)
		require.Equal(t, http.StatusNoContent, b.do(t, http.MethodPut, "bearer  "+token).Code, "the scheme in any case, then spaces")
	})

	t.Run("UnguardedRoutesStayOpen", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, http.StatusOK, setup(t, token).do(t, http.MethodGet).Code)
		require.Equal(t, http.StatusOK, setup(t, "").do(t, http.MethodGet).Code)
	})

	t.Run("NoOrMalformedCredentialsAre401WithAChallenge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, token)
		for name, auth := range map[string][]string{
			"none":          nil,
			"empty":         {""},
			"basic":         {"Basic dXNlcjpwYXNz"},
			"scheme alone":  {"Bearer"},
			"empty token":   {"Bearer "},
			"a space in it": {"Bearer " + token + " x"},
			"a quote":       {`Bearer "` + token + `"`},
			"twice":         {"Bearer " + token, "Bearer " + token},
			"too long":      {"Bearer " + strings.Repeat("a", 5000)},
		} {
			rec := b.do(t, http.MethodPut, auth...)
			d := requireProblem(t, rec, http.StatusUnauthorized, problem.TypeUnauthorized)
			require.Equal(t, `Bearer realm="test-admin"`, rec.Header().Get("WWW-Authenticate"), name)
			require.Contains(t, d.Detail, "Authorization: Bearer", name)
		}
	})

	t.Run("AWrongTokenIs401InvalidToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t, token)
		for _, wrong := range []string{token + "x", token[:len(token)-1], strings.ToUpper(token), "short"} {
			rec := b.do(t, http.MethodPut, "Bearer "+wrong)
			requireProblem(t, rec, http.StatusUnauthorized, problem.TypeUnauthorized)
			require.Contains(t, rec.Header().Get("WWW-Authenticate"), `Bearer realm="test-admin", error="invalid_token"`)
		}
	})

	t.Run("NoTokenConfiguredIs403WhateverIsSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		for _, auth := range [][]string{nil, {"Bearer " + token}, {"Bearer "}} {
			rec := b.do(t, http.MethodPut, auth...)
			d := requireProblem(t, rec, http.StatusForbidden, problem.TypeForbidden)
			require.Equal(t, "The admin API is disabled: set TEST_TOKEN.", d.Detail)
			require.Empty(t, rec.Header().Get("WWW-Authenticate"))
		}
	})

	t.Run("TheTokenIsNeverShown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, token)
		var answers strings.Builder
		for _, auth := range []string{"Bearer " + token, "Bearer " + token + "x", "Basic " + token, "Bearer " + token + " " + token} {
			rec := b.do(t, http.MethodPut, auth)
			answers.WriteString(rec.Body.String())
			for k, v := range rec.Header() {
				answers.WriteString(k + ": " + strings.Join(v, ",") + "\n")
			}
		}
		require.Contains(t, b.logs.String(), "request refused", "the refusals were logged")
		require.NotContains(t, b.logs.String(), token)
		require.NotContains(t, answers.String(), token)
	})

	t.Run("WithoutAnErrorFunctionTheSharedProblems", func(t *testing.T) {
		t.Parallel()
		h := bearer.New(bearer.Config{Token: token, Realm: "r"}).Require(http.NotFoundHandler())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/", nil))
		requireProblem(t, rec, http.StatusUnauthorized, problem.TypeUnauthorized)
		require.True(t, bearer.New(bearer.Config{Token: token}).Enabled())
		require.False(t, bearer.New(bearer.Config{}).Enabled())
	})
}

func TestCheck(t *testing.T) {
	t.Parallel()
	require.NoError(t, bearer.Check(token))
	require.NoError(t, bearer.Check("abcdefghijklmnop"), "16 bytes")
	require.NoError(t, bearer.Check("YWRtaW4tdG9rZW4tMTIzNA=="), "base64 with padding")
	for _, bad := range []string{"", "fifteen-bytes!!", "sixteen bytes xx", "sixteen-bytes-\"x", "with=inside-0123456", strings.Repeat("a", 5000)} {
		err := bearer.Check(bad)
		require.Error(t, err, "%q", bad)
		if bad != "" {
			require.NotContains(t, err.Error(), bad, "the error never quotes the token")
		}
	}
	require.EqualError(t, bearer.Check("short-token"), "must be at least 16 bytes long, is 11")
}
