package inboxrabbitmq

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

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
// body) with arbitrary values: it must not panic, and must count from 1.
func FuzzDecodeDelivery(f *testing.F) {
	f.Add("application/json", []byte(`{"a":1}`), "2", "orders.placed")
	f.Add("", []byte(`{`), "-1", "")
	f.Add("application/vnd.x+json; charset=utf-8", []byte("\xff"), "99999999999999999999", "k")
	f.Add("text/plain", []byte("hello"), "x", "orders.#")
	f.Add("application/json; charset=iso-8859-1", []byte("{\"a\":\"\xe9\"}"), "1", "")
	f.Add("application/json", []byte(`"\ud800"`), "0", "")
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
		// The checks of the content type and the body: package decide's fuzz test goes
		// further.
		if _, detail := refusal(Config{MaxMessageBytes: DefaultMaxMessageBytes}, d); !utf8.ValidString(detail) {
			t.Fatalf("the detail repeats invalid bytes: %q", detail)
		}
	})
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	cfg, err := Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "q", Name: "n", DeadLetterExchange: "dead",
		Handler:         func(context.Context, pgx.Tx, Delivery) error { return nil },
		MaxMessageBytes: 16,
		ContentTypes:    []string{"Application/JSON", "text/plain", ""},
		Types:           []string{"order.placed", "note"},
	}.WithDefaults()
	require.NoError(t, err)
	c := &Consumer{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	ok := amqp.Delivery{MessageId: "m", Type: "order.placed", ContentType: "application/json", Body: []byte(`{}`)}
	with := func(change func(*amqp.Delivery)) amqp.Delivery {
		d := ok
		change(&d)
		return d
	}
	for name, tc := range map[string]struct {
		d      amqp.Delivery
		reason string
	}{
		"Valid":                {ok, ""},
		"ValidWithParameters":  {with(func(d *amqp.Delivery) { d.ContentType = "application/json; charset=UTF-8" }), ""},
		"NoContentType":        {with(func(d *amqp.Delivery) { d.ContentType = "" }), ""},
		"PlainTextNotParsed":   {with(func(d *amqp.Delivery) { d.ContentType, d.Type, d.Body = "text/plain", "note", []byte("{") }), ""},
		"BodyAtLimit":          {with(func(d *amqp.Delivery) { d.Body = []byte(`{"a":"01234567"}`) }), ""},
		"MissingID":            {with(func(d *amqp.Delivery) { d.MessageId = "" }), ReasonMissingMessageID},
		"NULInID":              {with(func(d *amqp.Delivery) { d.MessageId = "m\x00" }), ReasonInvalidMessageID},
		"InvalidUTF8ID":        {with(func(d *amqp.Delivery) { d.MessageId = "\xff" }), ReasonInvalidMessageID},
		"OversizedID":          {with(func(d *amqp.Delivery) { d.MessageId = strings.Repeat("m", 256) }), ReasonInvalidMessageID},
		"OversizedType":        {with(func(d *amqp.Delivery) { d.Type = strings.Repeat("t", 256) }), ReasonInvalidMessageType},
		"NULInType":            {with(func(d *amqp.Delivery) { d.Type = "order\x00" }), ReasonInvalidMessageType},
		"BodyTooLarge":         {with(func(d *amqp.Delivery) { d.Body = []byte(`{"a":"012345678"}`) }), ReasonBodyTooLarge},
		"TooLargeBeforeJSON":   {with(func(d *amqp.Delivery) { d.Body = []byte(strings.Repeat("{", 17)) }), ReasonBodyTooLarge},
		"OtherContentType":     {with(func(d *amqp.Delivery) { d.ContentType = "application/xml" }), ReasonUnsupportedContentType},
		"JSONInLatin1":         {with(func(d *amqp.Delivery) { d.ContentType = "application/json; charset=latin1" }), ReasonUnsupportedContentType},
		"UnknownType":          {with(func(d *amqp.Delivery) { d.Type = "order.exploded" }), ReasonUnknownType},
		"EmptyTypeNotListed":   {with(func(d *amqp.Delivery) { d.Type = "" }), ReasonUnknownType},
		"MalformedJSON":        {with(func(d *amqp.Delivery) { d.Body = []byte(`{`) }), ReasonMalformedJSON},
		"InvalidUTF8InJSON":    {with(func(d *amqp.Delivery) { d.Body = []byte("\"\xff\"") }), ReasonMalformedJSON},
		"IDCheckedBeforeBody":  {with(func(d *amqp.Delivery) { d.MessageId, d.Body = "\xff", []byte(strings.Repeat("x", 99)) }), ReasonInvalidMessageID},
		"TypeCheckedBeforeCT":  {with(func(d *amqp.Delivery) { d.Type, d.ContentType = "\xff", "image/png" }), ReasonInvalidMessageType},
		"ContentTypeBeforeTyp": {with(func(d *amqp.Delivery) { d.Type, d.ContentType = "x", "image/png" }), ReasonUnsupportedContentType},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reason, detail := c.refuse(tc.d)
			require.Equal(t, tc.reason, reason, detail)
			require.True(t, utf8.ValidString(detail), "the detail repeats invalid bytes: %q", detail)
		})
	}

	t.Run("AnyContentTypeAndTypeByDefault", func(t *testing.T) {
		t.Parallel()
		cfg, err := Config{
			URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "q", Name: "n", DeadLetterExchange: "dead",
			Handler: func(context.Context, pgx.Tx, Delivery) error { return nil },
		}.WithDefaults()
		require.NoError(t, err)
		require.Equal(t, DefaultMaxMessageBytes, cfg.MaxMessageBytes)
		require.Equal(t, DefaultMaxHold, cfg.MaxHold)
		c := &Consumer{cfg: cfg}
		reason, _ := c.refuse(amqp.Delivery{MessageId: "m", Type: "anything", ContentType: "application/x-protobuf", Body: []byte{0, 1}})
		require.Empty(t, reason)
	})
}

func TestForQueue(t *testing.T) {
	t.Parallel()
	p := amqp.Publishing{Headers: amqp.Table{
		HeaderDeadReason: "max-deliveries: x", HeaderOriginalQueue: "q", headerDeliveryCount: int64(2),
		HeaderRetries: int32(4), "tenant": "acme",
	}}
	forQueue(&p, 0)
	require.Equal(t, amqp.Table{"tenant": "acme"}, p.Headers)
	forQueue(&p, 2)
	require.Equal(t, amqp.Table{"tenant": "acme", HeaderRetries: int32(2)}, p.Headers)
}

func TestHoldDelay(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		retry, maxRetry, maxHold time.Duration
		first, limit             time.Duration
	}{
		"Defaults":             {DefaultRetryBaseDelay, DefaultRetryMaxDelay, DefaultMaxHold, time.Second, 30 * time.Second},
		"ShortHold":            {time.Second, 30 * time.Second, time.Second, time.Second / 8, time.Second / 4},
		"RetryDelayAboveHold":  {time.Minute, time.Hour, 10 * time.Second, 10 * time.Second / 8, 10 * time.Second / 4},
		"RetryMaxDelayBinding": {10 * time.Millisecond, 50 * time.Millisecond, time.Minute, 10 * time.Millisecond, 50 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := &Consumer{cfg: Config{RetryBaseDelay: tc.retry, RetryMaxDelay: tc.maxRetry, MaxHold: tc.maxHold}}
			for range 20 {
				require.LessOrEqual(t, c.holdDelay(1), tc.first)
				require.GreaterOrEqual(t, c.holdDelay(1), tc.first/2)
				for n := 2; n < 40; n++ {
					require.LessOrEqual(t, c.holdDelay(n), tc.limit)
				}
				require.GreaterOrEqual(t, c.holdDelay(40), tc.limit/2)
			}
		})
	}
}

// refuse returns the reason and details for dead-lettering d without a transaction, or "",
// as c's handling of d decides.
func (c *Consumer) refuse(d amqp.Delivery) (reason, detail string) {
	return refusal(c.cfg, newDelivery(d))
}
