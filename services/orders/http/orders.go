package http

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/input"
	"github.com/outboxshop/outboxshop/services/orders"
)

// Headers of the idempotency protocol.
const (
	HeaderIdempotencyKey     = "Idempotency-Key"
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// orderJSON is the representation of an order.
type orderJSON struct {
	ID         uuid.UUID     `json:"id"`
	CustomerID string        `json:"customer_id"`
	Status     orders.Status `json:"status"`
	Items      []lineJSON    `json:"items"`
	CreatedAt  time.Time     `json:"created_at"`
	UpdatedAt  time.Time     `json:"updated_at"`
	History    []historyJSON `json:"history"`
}

type lineJSON struct {
	SKU      string `json:"sku"`
	Name     string `json:"name"`
	Quantity int    `json:"quantity"`
}

type historyJSON struct {
	From      orders.Status `json:"from,omitempty"`
	Status    orders.Status `json:"status"`
	Event     string        `json:"event"`
	Reason    string        `json:"reason,omitempty"`
	MessageID string        `json:"message_id,omitempty"`
	At        time.Time     `json:"at"`
}

func toJSON(o *orders.Order) orderJSON {
	out := orderJSON{
		ID: o.ID, CustomerID: o.CustomerID, Status: o.Status,
		Items:     make([]lineJSON, 0, len(o.Lines)),
		CreatedAt: o.CreatedAt.UTC(), UpdatedAt: o.UpdatedAt.UTC(),
		History: make([]historyJSON, 0, len(o.History)),
	}
	for _, l := range o.Lines {
		out.Items = append(out.Items, lineJSON(l))
	}
	for _, h := range o.History {
		out.History = append(out.History, historyJSON{
			From: h.From, Status: h.To, Event: h.Event, Reason: h.Reason, MessageID: h.MessageID, At: h.At.UTC(),
		})
	}
	return out
}

// renderOrder is the body of an answer that carries an order.
func renderOrder(o *orders.Order) ([]byte, error) {
	b, err := json.Marshal(toJSON(o))
	if err != nil {
		return nil, fmt.Errorf("encode order: %w", err)
	}
	return append(b, '\n'), nil
}

// createOrder handles POST /orders.
func (h *Handler) createOrder(w http.ResponseWriter, r *http.Request) {
	var idem *orders.IdempotencyKey
	key, hasKey, err := httpapi.Token(r, HeaderIdempotencyKey, orders.MaxIdempotencyKeyLength)
	if err != nil {
		h.error(w, r, orders.FromInput(err))
		return
	}
	body, err := httpapi.ReadJSON(w, r, MaxRequestBytes)
	if err != nil {
		h.error(w, r, orders.FromInput(err))
		return
	}
	req, err := DecodeOrderRequest(bytes.NewReader(body))
	if err != nil {
		h.error(w, r, err)
		return
	}
	if hasKey {
		idem = &orders.IdempotencyKey{Key: key, Fingerprint: req.Fingerprint()}
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.dbTimeout)
	defer cancel()
	res, err := h.orders.CreateOrder(ctx, orders.CreateOrderInput{
		Request:     req,
		Meta:        eventMeta(r),
		Idempotency: idem,
		Render: func(o *orders.Order) (orders.Response, error) {
			body, err := renderOrder(o)
			return orders.Response{Status: http.StatusCreated, Body: body}, err
		},
	})
	if err != nil {
		h.error(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+res.OrderID.String())
	if res.Replayed {
		h.log.InfoContext(r.Context(), "idempotent request replayed", "order_id", res.OrderID,
			"request_id", RequestID(r.Context()), "idempotency_key", key)
		w.Header().Set(HeaderIdempotentReplayed, "true")
		writeBody(w, res.Response.Status, res.Response.Body)
		return
	}
	h.log.InfoContext(r.Context(), "order created", "order_id", res.OrderID, "request_id", RequestID(r.Context()),
		"customer_id", res.Order.CustomerID, "lines", len(res.Order.Lines))
	if h.afterCommit != nil {
		h.afterCommit()
	}
	body = nil
	if res.Response != nil {
		body = res.Response.Body
	} else if body, err = renderOrder(res.Order); err != nil {
		h.error(w, r, err)
		return
	}
	writeBody(w, http.StatusCreated, body)
}

// eventMeta is the metadata of the events a request writes: its request id as correlation
// id. The trace context is not part of it: outbox.Add records the one of the request's ctx
// (its server span's) in the events' headers itself.
func eventMeta(r *http.Request) orders.EventMeta {
	return orders.EventMeta{CorrelationID: RequestID(r.Context())}
}

// orderID reads the {id} of the route. Anything but a UUID in its canonical form
// (input.ParseID: lowercase, hyphenated) names no order: 404.
func orderID(r *http.Request) (uuid.UUID, error) {
	raw := chi.URLParam(r, "id")
	id, ok := input.ParseID(raw)
	if !ok {
		return uuid.Nil, orders.Errorf(orders.CodeNotFound, "Order %q does not exist: order ids are lowercase UUIDs (8-4-4-4-12).", raw)
	}
	return id, nil
}

// getOrder handles GET /orders/{id}.
func (h *Handler) getOrder(w http.ResponseWriter, r *http.Request) {
	id, err := orderID(r)
	if err != nil {
		h.error(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.dbTimeout)
	defer cancel()
	o, err := h.orders.Order(ctx, id)
	if err != nil {
		h.error(w, r, err)
		return
	}
	h.writeOrder(w, r, http.StatusOK, o)
}

// cancelOrder handles POST /orders/{id}/cancel. The body, if any, is ignored.
func (h *Handler) cancelOrder(w http.ResponseWriter, r *http.Request) {
	id, err := orderID(r)
	if err != nil {
		h.error(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.dbTimeout)
	defer cancel()
	o, err := h.orders.CancelOrder(ctx, id, eventMeta(r))
	if err != nil {
		h.error(w, r, err)
		return
	}
	h.log.InfoContext(r.Context(), "order cancellation requested", "order_id", id,
		"request_id", RequestID(r.Context()), "status", o.Status)
	h.writeOrder(w, r, http.StatusOK, o)
}

func (h *Handler) writeOrder(w http.ResponseWriter, r *http.Request, status int, o *orders.Order) {
	body, err := renderOrder(o)
	if err != nil {
		h.error(w, r, err)
		return
	}
	writeBody(w, status, body)
}
