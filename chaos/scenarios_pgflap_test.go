package chaos

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAnswerLog(t *testing.T) {
	t.Parallel()

	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	try := func(key string, sent, answered float64, status int, replayed bool) attempt {
		return attempt{Key: key, Sent: at(sent), Answered: at(answered), Status: status, Replayed: replayed}
	}
	cut := func(key string, sent, answered float64) attempt {
		a := try(key, sent, answered, 0, false)
		a.Err = "EOF"
		return a
	}

	t.Run("RetriedSinceCountsKeysThatFailedThenTriedAgain", func(t *testing.T) {
		t.Parallel()
		attempts := []attempt{
			try("a", 1, 6, 503, false), try("a", 11, 11.1, 201, true), // failed after 5, retried
			try("b", 1, 6, 503, false),                     // failed, not retried yet
			cut("c", 7, 8), try("c", 8.05, 8.1, 201, true), // cut, retried at once
			try("d", 0, 0.1, 201, false), try("d", 9, 9.1, 201, true), // never failed
			try("e", 1, 4, 503, false), try("e", 9, 9.1, 201, true), // failed before since
		}
		require.Equal(t, 2, retriedSince(attempts, at(5)))
		require.Equal(t, 3, retriedSince(attempts, at(0)))
		require.Equal(t, 0, retriedSince(attempts, at(12)))
		require.Equal(t, 3, failedIn(attempts, at(5), at(12)), "a, b and c failed in [5s, 12s)")
		require.Equal(t, 1, failedIn(attempts, at(0), at(5)), "e")
		require.Equal(t, 0, failedIn(attempts, at(8), at(8)), "an empty window")
	})

	t.Run("AckedAfterFailureIsAFirst201ThatReplays", func(t *testing.T) {
		t.Parallel()
		attempts := []attempt{
			try("lost", 1, 6, 503, false), try("lost", 11, 11.1, 201, true),
			cut("cut", 1, 2), try("cut", 2.1, 2.2, 201, true),
			try("fresh", 1, 6, 503, false), try("fresh", 11, 11.1, 201, false), // created by the retry
			try("dup", 0, 0.1, 201, false), try("dup", 0.2, 0.3, 201, true), // a duplicate sent on purpose
			try("late", 0, 0.1, 201, false), try("late", 1, 6, 503, false), try("late", 11, 11.1, 201, true),
			try("never", 1, 6, 503, false),
			try("waiting", 1, 6, 503, false), {Key: "waiting", Sent: at(11)}, // its retry in flight
		}
		// Answered out of the order they were sent: byKey sorts each key's attempts.
		attempts[0], attempts[1] = attempts[1], attempts[0]
		require.Equal(t, []string{"cut", "lost"}, ackedAfterFailure(attempts))
		require.Equal(t, "503 at 6.0s, 201 (replayed) at 11.1s", history(byKey(attempts)["lost"], base))
		require.Equal(t, "no answer at 2.0s (EOF), 201 (replayed) at 2.2s", history(byKey(attempts)["cut"], base))
		require.Equal(t, "503 at 6.0s, no answer yet (sent at 11.0s)", history(byKey(attempts)["waiting"], base))
		require.Equal(t, 1, retriedSince(attempts[len(attempts)-2:], at(5)), "a retry counts once sent")
		require.False(t, attempts[len(attempts)-1].failed(), "in flight is not failed")
	})

	t.Run("TheClientRecordsPostOrdersWithAKey", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Idempotency-Key") == "again" {
				w.Header().Set("Idempotent-Replayed", "true")
			}
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(srv.Close)
		var l answerLog
		c := l.client(2)
		t.Cleanup(c.CloseIdleConnections)
		send := func(method, path, key string) {
			req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader("{}"))
			require.NoError(t, err)
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			resp, err := c.Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
		}
		send(http.MethodPost, "/orders", "k1")
		send(http.MethodPost, "/orders", "again")
		send(http.MethodPost, "/orders", "")           // no key
		send(http.MethodPost, "/orders/x/cancel", "k") // not a creation
		send(http.MethodGet, "/orders", "k")
		got := l.all()
		require.Len(t, got, 2)
		for _, a := range got {
			require.False(t, a.inFlight())
		}
		require.Equal(t, "k1", got[0].Key)
		require.Equal(t, http.StatusCreated, got[0].Status)
		require.False(t, got[0].Replayed)
		require.True(t, got[1].Replayed)
		require.False(t, got[0].Answered.Before(got[0].Sent))

		srv.Close()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "down")
		_, err = c.Do(req)
		require.Error(t, err)
		got = l.all()
		require.Len(t, got, 3)
		require.Zero(t, got[2].Status)
		require.NotEmpty(t, got[2].Err)
		require.True(t, got[2].failed())
	})
}

func TestCompareFailover(t *testing.T) {
	t.Parallel()

	acked := map[string]string{
		"k-kept":    "o-kept",
		"k-lost":    "o-lost",    // replayed from the old primary alone
		"k-new":     "o-new",     // created on the new primary by a retry
		"k-keyless": "o-keyless", // the order survived, its key did not
	}
	old := map[string]string{"o-kept": "k-kept", "o-lost": "k-lost", "o-unacked": "k-unacked", "o-keyless": "k-keyless"}
	orders := map[string]string{"o-kept": "k-kept", "o-new": "k-new", "o-keyless": "", "o-other": "k-other"}
	reservations := map[string]string{"o-kept": "RESERVED", "o-lost": "RESERVED", "o-unacked": "REJECTED", "o-new": "RESERVED"}

	l := compareFailover(acked, old, orders, reservations)
	require.Equal(t, map[string]string{"k-lost": "o-lost", "k-keyless": "o-keyless"}, l.Lost)
	require.Equal(t, []string{"o-lost", "o-unacked"}, l.OnlyOld)
	require.Equal(t, []string{"o-lost"}, l.OnlyOldAcked)
	require.Equal(t, []string{"o-lost", "o-unacked"}, l.Orphaned)

	t.Run("NothingLost", func(t *testing.T) {
		t.Parallel()
		l := compareFailover(map[string]string{"k": "o"}, map[string]string{"o": "k"}, map[string]string{"o": "k"}, map[string]string{"o": "REJECTED"})
		require.Empty(t, l.Lost)
		require.Empty(t, l.OnlyOld)
		require.Empty(t, l.Orphaned)
	})
}

func TestAbbreviateIDs(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"a", "b"}, abbreviateIDs([]string{"a", "b"}, 2))
	items := []string{"a", "b", "c"}
	require.Equal(t, []string{"a", "b", "and 1 more"}, abbreviateIDs(items, 2))
	require.Equal(t, []string{"a", "b", "c"}, items, "the input is left alone")
}
