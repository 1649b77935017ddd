package outboxrabbitmq

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

func validMessage() outbox.Message {
	return outbox.Message{
		ID:            uuid.MustParse("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		Exchange:      "shop.events",
		RoutingKey:    "order.created",
		Type:          "OrderCreated",
		AggregateType: "order",
		AggregateID:   "42",
		Headers:       map[string]string{"trace": "t"},
		Payload:       json.RawMessage(`{"id":42}`),
		CreatedAt:     time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC),
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()

	tests := map[string]struct {
		edit            func(m *outbox.Message)
		maxMessageBytes int
		wantErr         error  // nil: the message may be sent
		wantText        string // in the error
	}{
		"Valid": {edit: func(*outbox.Message) {}},
		"EmptyPayload": {
			edit:    func(m *outbox.Message) { m.Payload = nil },
			wantErr: outbox.ErrInvalidMessage, wantText: "Payload is empty",
		},
		"PayloadNotJSONIsNotChecked": {
			// The broker does not read the body, and a json column cannot hold this.
			edit: func(m *outbox.Message) { m.Payload = json.RawMessage(`{not json`) },
		},
		"EmptyType": {
			edit:    func(m *outbox.Message) { m.Type = "" },
			wantErr: outbox.ErrInvalidMessage, wantText: "Type is empty",
		},
		"NoDestination": {
			edit:    func(m *outbox.Message) { m.Exchange, m.RoutingKey = "", "" },
			wantErr: outbox.ErrInvalidMessage, wantText: "no destination",
		},
		"StoredAggregateHeadersAreOverwrittenNotRefused": {
			edit: func(m *outbox.Message) {
				m.Headers[outbox.HeaderAggregateType] = "old"
				m.Headers[outbox.HeaderAggregateID] = "old"
			},
		},
		"OtherReservedHeader": {
			edit:    func(m *outbox.Message) { m.Headers["CC"] = "x" },
			wantErr: outbox.ErrInvalidMessage, wantText: "reserved",
		},
		"BodyAtTheLimit": {
			edit:            func(m *outbox.Message) { m.Payload = json.RawMessage(`"` + strings.Repeat("a", 8) + `"`) },
			maxMessageBytes: 10,
		},
		"BodyOverTheLimit": {
			edit:            func(m *outbox.Message) { m.Payload = json.RawMessage(`"` + strings.Repeat("a", 9) + `"`) },
			maxMessageBytes: 10,
			wantErr:         outbox.ErrTooLarge, wantText: "body of 11 bytes is over the broker's max_message_size of 10",
		},
		"NoLimit": {
			edit: func(m *outbox.Message) { m.Payload = json.RawMessage(`"` + strings.Repeat("a", 1<<20) + `"`) },
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := validMessage()
			tt.edit(&m)
			err := validate(m, tt.maxMessageBytes)
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantErr)
			require.True(t, outbox.IsPermanent(err), "a message that can never go is permanent: %v", err)
			require.ErrorContains(t, err, tt.wantText)
		})
	}

	t.Run("DoesNotTouchTheMessage", func(t *testing.T) {
		t.Parallel()
		m := validMessage()
		m.Headers[outbox.HeaderAggregateID] = "old"
		require.NoError(t, validate(m, 0))
		require.Equal(t, "old", m.Headers[outbox.HeaderAggregateID])
	})
}

func TestContentHeaderFrameSize(t *testing.T) {
	t.Parallel()

	// The fixed part: frame type, channel, size and end byte (8); class, weight, body size
	// and property flags (14); content type (1+16) and delivery mode (1).
	const fixed = 8 + 14 + 17 + 1
	tests := map[string]struct {
		edit func(m *outbox.Message)
		want func(m outbox.Message) int
	}{
		"AllProperties": {
			edit: func(m *outbox.Message) { m.Headers[outbox.HeaderCorrelationID] = "corr" },
			want: func(m outbox.Message) int { return fixed + m.HeaderBytes() + (1 + 4) + (1 + 36) + 8 + (1 + 12) },
		},
		"NoCorrelationID": {
			edit: func(*outbox.Message) {},
			want: func(m outbox.Message) int { return fixed + m.HeaderBytes() + (1 + 36) + 8 + (1 + 12) },
		},
		"NoTimestamp": {
			edit: func(m *outbox.Message) { m.CreatedAt = time.Time{} },
			want: func(m outbox.Message) int { return fixed + m.HeaderBytes() + (1 + 36) + (1 + 12) },
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := validMessage()
			tt.edit(&m)
			require.Equal(t, tt.want(m), contentHeaderFrameSize(m))
		})
	}
}

func TestFitsFrame(t *testing.T) {
	t.Parallel()

	m := validMessage()
	size := contentHeaderFrameSize(m)
	tests := map[string]struct {
		frameMax int
		fits     bool
	}{
		"NoLimit":     {frameMax: 0, fits: true},
		"RoomToSpare": {frameMax: 131072, fits: true},
		"ExactFit":    {frameMax: size, fits: true},
		"OneByteOver": {frameMax: size - 1, fits: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := fitsFrame(m, tt.frameMax)
			if tt.fits {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.True(t, outbox.IsPermanent(err))
			require.ErrorContains(t, err, "frame_max")
		})
	}

	t.Run("FittingKeepsTheOthersInOrder", func(t *testing.T) {
		t.Parallel()
		big := validMessage()
		big.Headers["big"] = strings.Repeat("b", 200)
		msgs := []outbox.Message{m, big, m, big}
		errs := make([]error, len(msgs))
		kept := fitting(msgs, []int{0, 1, 2, 3}, contentHeaderFrameSize(big)-1, errs)
		require.Equal(t, []int{0, 2}, kept)
		require.NoError(t, errs[0])
		require.ErrorIs(t, errs[1], outbox.ErrInvalidMessage)
		require.NoError(t, errs[2])
		require.ErrorIs(t, errs[3], outbox.ErrInvalidMessage)
	})
}
