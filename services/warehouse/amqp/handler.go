package amqp

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/internal/aftercommit"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/rabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/warehouse"
	"github.com/outboxshop/outboxshop/services/warehouse/postgres"
)

// Handler applies the orders service's events inside the inbox transaction and writes the
// answers to the outbox in the same transaction. Its Handle method is a rabbitmq.Handler.
//
//   - OrderCreated: [postgres.Reserve]; answers StockReserved or StockRejected.
//   - OrderCancelled: [postgres.Release]; answers StockReleased.
//   - An unknown type, an unsupported version or a body that breaks the contract:
//     inbox.Permanent, so the consumer dead-letters the message with the reason.
//   - A message that changes nothing (a second OrderCreated or OrderCancelled for an order
//     already handled) is logged and acknowledged, and answered by nothing.
//   - Any other error (the database, a deadlock) is returned as it is: the transaction rolls
//     back and the consumer retries the message.
type Handler struct {
	// Committed, when set, is called with the decision of every OrderCreated and
	// OrderCancelled that changed something (not ActionIgnore), after the inbox transaction
	// that applied it committed: never for a transaction that rolled back, nor for a
	// duplicate, which the inbox skips before the handler. It needs the transaction to come
	// from an aftercommit.Wrap'ped pool, as [NewConsumer]'s do; with another it is not called.
	// Set it before the handler runs.
	Committed func(warehouse.Decision)

	exchange string
	log      *slog.Logger
	now      func() time.Time
	// outbox writes the answers, recording the trace context of the handler's ctx (the
	// consumer's process span) in their headers through its propagator.
	outbox *outbox.Store
}

var _ rabbitmq.Handler = (*Handler)(nil).Handle

// defaultOutbox is the outbox of the default tables, recording the trace context through
// the global propagator until [NewConsumer] gives it the consumer's.
var defaultOutbox = func() *outbox.Store {
	s, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		panic(fmt.Sprintf("the default outbox tables: %v", err))
	}
	return s
}()

// NewHandler returns a handler that publishes its answers to exchange (the events exchange)
// and logs to log (nil discards).
func NewHandler(exchange string, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Handler{exchange: exchange, log: log, now: func() time.Time { return time.Now().UTC() }, outbox: defaultOutbox}
}

// Handle applies one delivery inside tx. See [Handler].
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, d rabbitmq.Delivery) error {
	log := h.log.With(slog.String("message_id", d.ID), slog.String("message_type", d.Type),
		slog.String("correlation_id", correlationID(d)))
	switch d.Type {
	case warehouse.TypeOrderCreated:
		return h.orderCreated(ctx, tx, d, log)
	case warehouse.TypeOrderCancelled:
		return h.orderCancelled(ctx, tx, d, log)
	default:
		err := fmt.Errorf("unknown event type %q (the warehouse consumes %s and %s)",
			d.Type, warehouse.TypeOrderCreated, warehouse.TypeOrderCancelled)
		log.WarnContext(ctx, "message refused: dead-lettering it", slog.Any("error", err))
		return inbox.Permanent(err)
	}
}

func (h *Handler) orderCreated(ctx context.Context, tx pgx.Tx, d rabbitmq.Delivery, log *slog.Logger) error {
	ev, err := warehouse.DecodeOrderCreated(d.Body)
	if err != nil {
		log = log.With(slog.String("order_id", peekOrderID(d.Body)))
		log.WarnContext(ctx, "OrderCreated refused: dead-lettering it", slog.Any("error", err))
		return inbox.Permanent(err)
	}
	log = log.With(slog.String("order_id", ev.OrderID.String()))
	now := h.now()
	dec, err := postgres.Reserve(ctx, tx, ev.OrderID, ev.Items, d.ID, now)
	if err != nil {
		return fmt.Errorf("reserve order %s: %w", ev.OrderID, err)
	}
	var msg outbox.Message
	switch dec.Action {
	case warehouse.ActionIgnore:
		log.WarnContext(ctx, "OrderCreated changes nothing; acknowledged without an answer", slog.String("why", dec.Why))
		return nil
	case warehouse.ActionReserve:
		msg, err = h.message(d, ev.OrderID, warehouse.TypeStockReserved, warehouse.RoutingKeyStockReserved,
			warehouse.NewStockReserved(ev.OrderID, ev.Items, now))
	case warehouse.ActionReject:
		msg, err = h.message(d, ev.OrderID, warehouse.TypeStockRejected, warehouse.RoutingKeyStockRejected,
			warehouse.NewStockRejected(ev.OrderID, dec.Reason, dec.Shortages, now))
	default:
		return fmt.Errorf("order %s: unexpected decision %s", ev.OrderID, dec)
	}
	if err != nil {
		return err
	}
	if err := h.outbox.Add(ctx, tx, msg); err != nil {
		return fmt.Errorf("order %s: write %s to the outbox: %w", ev.OrderID, msg.Type, err)
	}
	h.afterCommit(tx, dec)
	log.InfoContext(ctx, "order handled", slog.String("decision", dec.String()), slog.Any("lines", ev.Items),
		slog.Any("shortages", dec.Shortages), slog.String("answer_id", msg.ID.String()))
	return nil
}

func (h *Handler) orderCancelled(ctx context.Context, tx pgx.Tx, d rabbitmq.Delivery, log *slog.Logger) error {
	ev, err := warehouse.DecodeOrderCancelled(d.Body)
	if err != nil {
		log = log.With(slog.String("order_id", peekOrderID(d.Body)))
		log.WarnContext(ctx, "OrderCancelled refused: dead-lettering it", slog.Any("error", err))
		return inbox.Permanent(err)
	}
	log = log.With(slog.String("order_id", ev.OrderID.String()))
	now := h.now()
	dec, released, err := postgres.Release(ctx, tx, ev.OrderID, d.ID, now)
	if err != nil {
		return fmt.Errorf("release order %s: %w", ev.OrderID, err)
	}
	switch dec.Action {
	case warehouse.ActionIgnore:
		log.InfoContext(ctx, "OrderCancelled changes nothing; acknowledged without an answer", slog.String("why", dec.Why))
		return nil
	case warehouse.ActionRelease, warehouse.ActionTombstone, warehouse.ActionAcknowledgeCancel:
	default:
		return fmt.Errorf("order %s: unexpected decision %s", ev.OrderID, dec)
	}
	msg, err := h.message(d, ev.OrderID, warehouse.TypeStockReleased, warehouse.RoutingKeyStockReleased,
		warehouse.NewStockReleased(ev.OrderID, released, now))
	if err != nil {
		return err
	}
	if err := h.outbox.Add(ctx, tx, msg); err != nil {
		return fmt.Errorf("order %s: write %s to the outbox: %w", ev.OrderID, msg.Type, err)
	}
	h.afterCommit(tx, dec)
	log.InfoContext(ctx, "cancellation handled", slog.String("decision", dec.String()), slog.Any("released", released),
		slog.String("answer_id", msg.ID.String()))
	return nil
}

// afterCommit reports dec to Committed once tx has committed.
func (h *Handler) afterCommit(tx pgx.Tx, dec warehouse.Decision) {
	if h.Committed != nil {
		aftercommit.Register(tx, func() { h.Committed(dec) })
	}
}

// message builds the outbox message answering d: same saga (correlation id), caused by d.
// Its trace context is not copied from d: the outbox records the one of the handler's ctx,
// the consumer's process span, a child of the publish that delivered d.
func (h *Handler) message(d rabbitmq.Delivery, orderID uuid.UUID, typ, routingKey string, event any) (outbox.Message, error) {
	payload, err := json.Marshal(event)
	if err != nil {
		return outbox.Message{}, fmt.Errorf("encode %s: %w", typ, err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return outbox.Message{}, fmt.Errorf("new message id: %w", err)
	}
	headers := map[string]string{
		outbox.HeaderCorrelationID: correlationID(d),
		outbox.HeaderCausationID:   d.ID,
	}
	return outbox.Message{
		ID:            id,
		Exchange:      h.exchange,
		RoutingKey:    routingKey,
		Type:          typ,
		AggregateType: warehouse.AggregateType,
		AggregateID:   orderID.String(),
		Payload:       payload,
		Headers:       headers,
	}, nil
}

// correlationID is the saga's id: the AMQP correlation-id property, else the correlation_id
// header, else (a producer that sets neither) the message id itself.
func correlationID(d rabbitmq.Delivery) string {
	return cmp.Or(d.CorrelationID, headerString(d, outbox.HeaderCorrelationID), d.ID)
}

func headerString(d rabbitmq.Delivery, key string) string {
	switch v := d.Headers[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// peekOrderID returns the order_id of a body that could not be decoded, when it has one, so
// that the log line of a refused message still names its order.
func peekOrderID(body []byte) string {
	var v struct {
		OrderID any `json:"order_id"`
	}
	if json.Unmarshal(body, &v) != nil || v.OrderID == nil {
		return ""
	}
	return fmt.Sprint(v.OrderID)
}
