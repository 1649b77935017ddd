package amqp

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// ConsumerName is the warehouse's inbox consumer name. Keep it stable: the inbox deduplicates
// per name, so renaming it forgets which messages were processed.
const ConsumerName = "warehouse"

// OrderApplier applies the orders service's events to the stock inside the inbox
// transaction, and writes the answer to the outbox in the same transaction: the store as the
// handler sees it. *postgres.Store implements it (the app wraps it to count the decisions).
type OrderApplier interface {
	ApplyOrderCreated(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCreated, meta warehouse.EventMeta) (warehouse.OrderOutcome, error)
	ApplyOrderCancelled(ctx context.Context, tx pgx.Tx, ev warehouse.OrderCancelled, meta warehouse.EventMeta) (warehouse.OrderOutcome, error)
}

// HandlerConfig configures NewHandler.
type HandlerConfig struct {
	// OrderCreatedVersions are the versions of OrderCreated the handler reads; nil: every
	// version this warehouse reads (warehouse.OrderCreatedVersions). A release keeps reading a
	// version until none can arrive any more (docs/events.md#changing-an-event); a shorter
	// list is how an operator stops reading one without a new release.
	OrderCreatedVersions []int
	// Logger receives a line per message handled or refused. nil discards.
	Logger *slog.Logger
}

// NewHandler returns the inbox handler of the orders service's events: it decodes a delivery
// (warehouse.DecodeOrderCreated, warehouse.DecodeOrderCancelled) and applies it through store,
// with the delivery's correlation id and its id as the causation id of the answer.
//
//   - OrderCreated: reserved or rejected; answered StockReserved or StockRejected.
//   - OrderCancelled: released; answered StockReleased.
//   - An unknown type, a version the handler does not read (cfg.OrderCreatedVersions) or a
//     body that breaks the contract: inbox.Permanent, so the consumer dead-letters the
//     message with the reason (docs/runbook.md says how to replay it once fixed).
//   - A message that changes nothing (a second OrderCreated or OrderCancelled for an order
//     already handled) is logged and acknowledged, and answered by nothing.
//   - Any other error (the database, a deadlock) is returned as it is: the transaction rolls
//     back and the consumer retries the message.
func NewHandler(store OrderApplier, cfg HandlerConfig) inboxrabbitmq.Handler {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	versions := cfg.OrderCreatedVersions
	return func(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
		log := log.With(slog.String("message_id", d.ID), slog.String("message_type", d.Type),
			slog.String("correlation_id", correlationID(d)))
		meta := warehouse.EventMeta{CorrelationID: correlationID(d), CausationID: d.ID}
		switch d.Type {
		case warehouse.TypeOrderCreated:
			return orderCreated(ctx, tx, store, d, meta, versions, log)
		case warehouse.TypeOrderCancelled:
			return orderCancelled(ctx, tx, store, d, meta, log)
		default:
			err := fmt.Errorf("unknown event type %q (the warehouse consumes %s and %s)",
				d.Type, warehouse.TypeOrderCreated, warehouse.TypeOrderCancelled)
			log.WarnContext(ctx, "message refused: dead-lettering it", slog.Any("error", err))
			return inbox.Permanent(err)
		}
	}
}

func orderCreated(ctx context.Context, tx pgx.Tx, store OrderApplier, d inboxrabbitmq.Delivery, meta warehouse.EventMeta,
	versions []int, log *slog.Logger,
) error {
	ev, err := warehouse.DecodeOrderCreated(d.Body, versions)
	if err != nil {
		log = log.With(slog.String("order_id", peekOrderID(d.Body)))
		log.WarnContext(ctx, "OrderCreated refused: dead-lettering it", slog.Any("error", err))
		return inbox.Permanent(err)
	}
	log = log.With(slog.String("order_id", ev.OrderID.String()))
	out, err := store.ApplyOrderCreated(ctx, tx, ev, meta)
	if err != nil {
		return err
	}
	if out.Decision.Action == warehouse.ActionIgnore {
		log.WarnContext(ctx, "OrderCreated changes nothing; acknowledged without an answer", slog.String("why", out.Decision.Why))
		return nil
	}
	log.InfoContext(ctx, "order handled", slog.String("decision", out.Decision.String()), slog.Any("lines", ev.Lines),
		slog.Any("shortages", out.Decision.Shortages), slog.String("answer_id", out.AnswerID.String()))
	return nil
}

func orderCancelled(ctx context.Context, tx pgx.Tx, store OrderApplier, d inboxrabbitmq.Delivery, meta warehouse.EventMeta, log *slog.Logger) error {
	ev, err := warehouse.DecodeOrderCancelled(d.Body)
	if err != nil {
		log = log.With(slog.String("order_id", peekOrderID(d.Body)))
		log.WarnContext(ctx, "OrderCancelled refused: dead-lettering it", slog.Any("error", err))
		return inbox.Permanent(err)
	}
	log = log.With(slog.String("order_id", ev.OrderID.String()))
	out, err := store.ApplyOrderCancelled(ctx, tx, ev, meta)
	if err != nil {
		return err
	}
	if out.Decision.Action == warehouse.ActionIgnore {
		log.InfoContext(ctx, "OrderCancelled changes nothing; acknowledged without an answer", slog.String("why", out.Decision.Why))
		return nil
	}
	log.InfoContext(ctx, "cancellation handled", slog.String("decision", out.Decision.String()), slog.Any("released", out.Released),
		slog.String("answer_id", out.AnswerID.String()))
	return nil
}

// correlationID is the saga's id: the AMQP correlation-id property, else the correlation_id
// header, else (a producer that sets neither) the message id itself.
func correlationID(d inboxrabbitmq.Delivery) string {
	return cmp.Or(d.CorrelationID, headerString(d, outbox.HeaderCorrelationID), d.ID)
}

func headerString(d inboxrabbitmq.Delivery, key string) string {
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
