package decide

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// The refusals themselves are tested through the consumer's configuration, in package
// rabbitmq (TestRefuse), and through rabbitmqtest.

func TestAfterFailure(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		interrupted          bool
		class                inbox.Class
		count, maxDeliveries int
		step                 Step
		reason               Reason
	}{
		"FirstFailureRetries":         {false, inbox.ClassFailed, 1, 5, Retry, NoReason},
		"LastButOneRetries":           {false, inbox.ClassFailed, 4, 5, Retry, NoReason},
		"LastAttemptDeadLetters":      {false, inbox.ClassFailed, 5, 5, DeadLetter, MaxDeliveries},
		"BeyondTheLimitDeadLetters":   {false, inbox.ClassFailed, 9, 5, DeadLetter, MaxDeliveries},
		"SingleAttempt":               {false, inbox.ClassFailed, 1, 1, DeadLetter, MaxDeliveries},
		"PermanentAtOnce":             {false, inbox.ClassPermanent, 1, 5, DeadLetter, Permanent},
		"PermanentOnTheLastAttempt":   {false, inbox.ClassPermanent, 5, 5, DeadLetter, Permanent},
		"TransientHolds":              {false, inbox.ClassTransient, 1, 5, Hold, NoReason},
		"TransientOnTheLastAttempt":   {false, inbox.ClassTransient, 5, 5, Hold, NoReason},
		"InterruptedBeforeClass":      {true, inbox.ClassFailed, 5, 5, Interrupted, NoReason},
		"InterruptedPermanent":        {true, inbox.ClassPermanent, 1, 5, Interrupted, NoReason},
		"InterruptedTransient":        {true, inbox.ClassTransient, 1, 5, Interrupted, NoReason},
		"InterruptedFirstFailureToo":  {true, inbox.ClassFailed, 1, 5, Interrupted, NoReason},
		"RetryCopyOfAReplayedMessage": {false, inbox.ClassFailed, 2, 3, Retry, NoReason},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			step, reason := AfterFailure(tc.interrupted, tc.class, tc.count, tc.maxDeliveries)
			require.Equal(t, tc.step, step)
			require.Equal(t, tc.reason, reason)
		})
	}
}

func TestInvalidMessage(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		msg  inbox.Message
		want Reason
	}{
		"NoID":        {inbox.Message{Type: "t"}, MissingMessageID},
		"NULInID":     {inbox.Message{ID: "m\x00"}, InvalidMessageID},
		"LongID":      {inbox.Message{ID: strings.Repeat("m", inbox.MaxMessageIDBytes+1)}, InvalidMessageID},
		"InvalidType": {inbox.Message{ID: "m", Type: "\xff"}, InvalidMessageType},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.msg.Validate()
			require.Error(t, err)
			require.Equal(t, tc.want, InvalidMessage(err))
		})
	}
}

func TestIsJSON(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"":                                true,
		"  ":                              true,
		"application/json":                true,
		"Application/JSON":                true,
		"application/json; charset=utf-8": true,
		"application/vnd.orders+json":     true,
		"application/json;;":              true,
		"text/plain":                      false,
		"application/octet-stream":        false,
		"application/x-protobuf":          false,
	} {
		t.Run(ct, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, want, isJSON(ct))
		})
	}
}

func TestMediaTypeAndCharset(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string][2]string{
		"":                                   {"", ""},
		"application/json":                   {"application/json", ""},
		"Application/JSON; Charset=UTF-8":    {"application/json", "UTF-8"},
		"application/json;;":                 {"application/json", ""},
		"text/plain; charset=\"iso-8859-1\"": {"text/plain", "iso-8859-1"},
	} {
		require.Equal(t, want[0], mediaType(ct), ct)
		require.Equal(t, want[1], charset(ct), ct)
	}
	require.Equal(t, []string{"application/json", ""}, MediaTypes([]string{"Application/JSON; charset=utf-8", ""}))
	require.NotNil(t, MediaTypes(nil))
}

// FuzzContentTypeAndBody feeds the checks of outside input (content type, body) with
// arbitrary values: they must not panic, must agree with encoding/json on what is valid JSON,
// and must never repeat invalid bytes in a detail.
func FuzzContentTypeAndBody(f *testing.F) {
	f.Add("application/json", []byte(`{"a":1}`))
	f.Add("", []byte(`{`))
	f.Add("application/vnd.x+json; charset=utf-8", []byte("\xff"))
	f.Add("text/plain", []byte("hello"))
	f.Add("application/json; charset=iso-8859-1", []byte("{\"a\":\"\xe9\"}"))
	f.Add("application/json", []byte(`"\ud800"`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		_ = isJSON(contentType)
		_ = charset(contentType)
		if mt := mediaType(contentType); mt != strings.ToLower(mt) {
			t.Fatalf("media type %q is not lower case", mt)
		}
		valid := json.Valid(body) && utf8.Valid(body)
		if err := checkJSON(body); (err == nil) != valid {
			t.Fatalf("checkJSON(%q) = %v, want valid %v", body, err, valid)
		}
		_, detail := Refusal(Message{ID: "m", ContentType: contentType, Body: body}, Acceptance{MaxMessageBytes: 1 << 20})
		if !utf8.ValidString(detail) {
			t.Fatalf("the detail repeats invalid bytes: %q", detail)
		}
	})
}

func TestPanicError(t *testing.T) {
	t.Parallel()
	cause := errors.New("nil map")
	err := PanicError(cause)
	require.ErrorIs(t, err, cause)
	require.EqualError(t, err, "handler panicked: nil map")
	require.EqualError(t, PanicError(42), "handler panicked: 42")
	require.Equal(t, inbox.ClassFailed, inbox.Classify(PanicError("boom")))
}
