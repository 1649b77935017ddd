package rabbitmq

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	t.Parallel()

	t.Run("GrowsAndIsCapped", func(t *testing.T) {
		t.Parallel()
		for n, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
			want *= time.Millisecond
			for range 50 {
				got := backoff(100*time.Millisecond, time.Second, n)
				require.GreaterOrEqual(t, got, want/2, "n=%d", n)
				require.LessOrEqual(t, got, want, "n=%d", n)
			}
		}
	})

	t.Run("HugeExponentDoesNotOverflow", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{31, 32, 63, 64, 1 << 20} {
			got := backoff(time.Second, time.Minute, n)
			require.GreaterOrEqual(t, got, 30*time.Second)
			require.LessOrEqual(t, got, time.Minute)
		}
	})
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

func TestHeaderInt(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in   any
		want int
	}{
		"Absent":   {nil, 0},
		"Int32":    {int32(3), 3},
		"Int64":    {int64(4), 4},
		"Int8":     {int8(2), 2},
		"Uint8":    {uint8(2), 2},
		"String":   {"7", 7},
		"Garbage":  {"x", 0},
		"Negative": {int32(-5), 0},
		"Huge":     {int64(1) << 40, 1 << 20},
		"Float":    {1.5, 0},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, headerInt(tc.in))
		})
	}
}

func TestNewDelivery(t *testing.T) {
	t.Parallel()

	t.Run("Original", func(t *testing.T) {
		t.Parallel()
		d := newDelivery(amqp.Delivery{MessageId: "m", Exchange: "orders", RoutingKey: "orders.placed"})
		require.Equal(t, 1, d.DeliveryCount)
		require.Equal(t, "orders", d.Exchange)
		require.Equal(t, "orders.placed", d.RoutingKey)
	})

	t.Run("RetryCopyKeepsTheOriginalRoute", func(t *testing.T) {
		t.Parallel()
		d := newDelivery(amqp.Delivery{MessageId: "m", Exchange: "", RoutingKey: "q", Headers: amqp.Table{
			HeaderRetries: int32(2), HeaderOriginalExchange: "orders", HeaderOriginalRoutingKey: "orders.placed",
		}})
		require.Equal(t, 3, d.DeliveryCount)
		require.Equal(t, "orders", d.Exchange)
		require.Equal(t, "orders.placed", d.RoutingKey)
	})

	t.Run("ReplayedDeadLetterStartsOver", func(t *testing.T) {
		t.Parallel()
		d := newDelivery(amqp.Delivery{MessageId: "m", Headers: amqp.Table{
			HeaderRetries: int32(4), HeaderDeadReason: "max-deliveries: boom",
		}})
		require.Equal(t, 1, d.DeliveryCount)
	})
}

// FuzzDecodeDelivery feeds the consumer's decoding of outside input (headers, content type,
// body) with arbitrary values: it must not panic, must count from 1, and must agree with
// encoding/json on what is valid JSON.
func FuzzDecodeDelivery(f *testing.F) {
	f.Add("application/json", []byte(`{"a":1}`), "2", "orders.placed")
	f.Add("", []byte(`{`), "-1", "")
	f.Add("application/vnd.x+json; charset=utf-8", []byte("\xff"), "99999999999999999999", "k")
	f.Add("text/plain", []byte("hello"), "x", "orders.#")
	f.Fuzz(func(t *testing.T, contentType string, body []byte, retries, routingKey string) {
		d := newDelivery(amqp.Delivery{
			MessageId:   "m",
			ContentType: contentType,
			Body:        body,
			Headers:     amqp.Table{HeaderRetries: retries, HeaderOriginalRoutingKey: routingKey},
		})
		if d.DeliveryCount < 1 || d.DeliveryCount > 1<<20+1 {
			t.Fatalf("delivery count %d", d.DeliveryCount)
		}
		if d.RoutingKey != routingKey {
			t.Fatalf("routing key %q, want %q", d.RoutingKey, routingKey)
		}
		_ = isJSON(contentType)
		if err := checkJSON(body); (err == nil) != json.Valid(body) {
			t.Fatalf("checkJSON(%q) = %v, json.Valid = %v", body, err, json.Valid(body))
		}
	})
}
