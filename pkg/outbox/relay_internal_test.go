package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRefusalsEnded: a streak of refusals ends once the broker accepted a message since the
// last refusal and refused nothing for refusalsOver; not at the first accepted batch.
func TestRefusalsEnded(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	refusal := t0.UnixNano()
	for _, tc := range []struct {
		name                      string
		lastRefusal, lastAccepted int64
		at                        time.Duration
		want                      bool
	}{
		{name: "NoRefusalEver", lastAccepted: refusal, at: time.Hour},
		{name: "NothingAcceptedSince", lastRefusal: refusal, lastAccepted: refusal - 1, at: time.Hour},
		{name: "AcceptedButTooSoon", lastRefusal: refusal, lastAccepted: refusal + 1, at: refusalsOver - time.Nanosecond},
		{name: "AcceptedAndQuietLongEnough", lastRefusal: refusal, lastAccepted: refusal + 1, at: refusalsOver, want: true},
		{name: "AcceptedInTheSameInstant", lastRefusal: refusal, lastAccepted: refusal, at: refusalsOver, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, refusalsEnded(tc.lastRefusal, tc.lastAccepted, t0.Add(tc.at)))
		})
	}
}
