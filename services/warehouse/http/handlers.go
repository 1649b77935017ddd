package http

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/problem"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// StockItem is a SKU as the API shows it.
type StockItem struct {
	SKU       string `json:"sku"`
	Name      string `json:"name"`
	Available int64  `json:"available"`
	// Reserved is what RESERVED reservations hold; it is not part of Available.
	Reserved  int64     `json:"reserved"`
	UpdatedAt time.Time `json:"updated_at"`
}

// StockList is the body of GET /stock.
type StockList struct {
	Items []StockItem `json:"items"`
}

// PutStockRequest is the body of PUT /stock/{sku}.
type PutStockRequest struct {
	// Available is required: 0 to warehouse.MaxAvailable.
	Available *int64 `json:"available"`
	// Name is optional: it renames the SKU; a new SKU without one is named after itself.
	Name *string `json:"name,omitempty"`
}

// Reservation is what the warehouse did for an order, as the API shows it.
type Reservation struct {
	OrderID uuid.UUID `json:"order_id"`
	// Status is RESERVED, REJECTED, RELEASED or CANCELLED.
	Status string `json:"status"`
	// Reason is empty for RESERVED.
	Reason string `json:"reason,omitempty"`
	// Held reports whether Lines are held for the order now (Status RESERVED).
	Held bool `json:"held"`
	// Lines are the order's lines, merged per SKU.
	Lines     []warehouse.Line `json:"lines"`
	CreatedAt time.Time        `json:"created_at"`
	UpdatedAt time.Time        `json:"updated_at"`
}

func toStockItem(i warehouse.StockItem) StockItem {
	return StockItem{SKU: i.SKU, Name: i.Name, Available: i.Available, Reserved: i.Reserved, UpdatedAt: i.UpdatedAt.UTC()}
}

func (s *server) dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.DBTimeout)
}

func (s *server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{}
	if s.cfg.Status != nil {
		maps.Copy(checks, s.cfg.Status())
	}
	if s.cfg.Pinger != nil {
		ctx, cancel := context.WithTimeout(r.Context(), min(s.cfg.DBTimeout, 2*time.Second))
		defer cancel()
		if err := s.cfg.Pinger.Ping(ctx); err != nil {
			w.Header().Set("Retry-After", fmt.Sprint(RetryAfterSeconds))
			s.log.DebugContext(r.Context(), "not ready: database unavailable", requestAttr(r), "error", err)
			problem.Write(w, r, problem.Details{Status: http.StatusServiceUnavailable,
				Detail: "Not ready: the database is unavailable."})
			return
		}
		checks["database"] = "up"
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}

func (s *server) listStock(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	items, err := s.cfg.Store.ListStock(ctx)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := StockList{Items: make([]StockItem, 0, len(items))}
	for _, i := range items {
		out.Items = append(out.Items, toStockItem(i))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getStock(w http.ResponseWriter, r *http.Request) {
	sku := chi.URLParam(r, "sku")
	if !warehouse.ValidSKU(sku) {
		s.fail(w, r, warehouse.Errorf(warehouse.CodeNotFound, "SKU %q does not exist.", sku))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	item, err := s.cfg.Store.GetStock(ctx, sku)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toStockItem(item))
}

func (s *server) putStock(w http.ResponseWriter, r *http.Request) {
	sku := chi.URLParam(r, "sku")
	var req PutStockRequest
	if err := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	name, err := validatePutStock(sku, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	item, created, err := s.cfg.Store.SetStock(ctx, sku, name, *req.Available)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.InfoContext(r.Context(), "stock set", requestAttr(r), "sku", sku, "available", item.Available, "created", created)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/stock/"+sku)
	}
	writeJSON(w, status, toStockItem(item))
}

// validatePutStock checks the SKU and the request and returns the (trimmed) name.
func validatePutStock(sku string, req PutStockRequest) (string, error) {
	var fields []warehouse.FieldError
	if !warehouse.ValidSKU(sku) {
		fields = append(fields, warehouse.FieldError{Field: "sku",
			Message: "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"})
	}
	switch {
	case req.Available == nil:
		fields = append(fields, warehouse.FieldError{Field: "available", Message: "is required"})
	case *req.Available < 0 || *req.Available > warehouse.MaxAvailable:
		fields = append(fields, warehouse.FieldError{Field: "available",
			Message: fmt.Sprintf("must be an integer from 0 to %d", warehouse.MaxAvailable)})
	}
	var name string
	if req.Name != nil {
		name = strings.TrimSpace(*req.Name)
		switch {
		case name == "":
			fields = append(fields, warehouse.FieldError{Field: "name", Message: "must not be empty when given"})
		case utf8.RuneCountInString(name) > warehouse.MaxNameLength:
			fields = append(fields, warehouse.FieldError{Field: "name",
				Message: fmt.Sprintf("must be at most %d characters", warehouse.MaxNameLength)})
		case strings.ContainsFunc(name, unicode.IsControl):
			fields = append(fields, warehouse.FieldError{Field: "name", Message: "must not contain control characters"})
		}
	}
	if len(fields) > 0 {
		return "", &warehouse.Error{Code: warehouse.CodeValidation, Message: "The request has invalid fields.", Fields: fields}
	}
	return name, nil
}

func (s *server) getReservation(w http.ResponseWriter, r *http.Request) {
	raw := chi.URLParam(r, "order_id")
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		s.fail(w, r, warehouse.Errorf(warehouse.CodeNotFound, "No reservation for order %q: order ids are UUIDs.", raw))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	res, err := s.cfg.Store.GetReservation(ctx, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	lines := res.Lines
	if lines == nil {
		lines = []warehouse.Line{}
	}
	writeJSON(w, http.StatusOK, Reservation{
		OrderID: res.OrderID, Status: string(res.Status), Reason: res.Reason, Held: res.Status.Holds(),
		Lines: lines, CreatedAt: res.CreatedAt.UTC(), UpdatedAt: res.UpdatedAt.UTC(),
	})
}

// decodeJSON reads a JSON request body into v: the content type must be JSON (415), the body
// at most limit bytes (413), one JSON value with only known fields and nothing after it
// (400); a value of the wrong type is a 422 naming the field.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return warehouse.Errorf(warehouse.CodeUnsupportedMediaType, "The body must be JSON (Content-Type: application/json), not %q.", ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return warehouse.Errorf(warehouse.CodeUnsupportedMediaType, "The body must be UTF-8, not %q.", cs)
	}
	if r.ContentLength > limit {
		return warehouse.Errorf(warehouse.CodeTooLarge, "The body must be at most %d bytes.", limit)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err, limit)
	}
	switch err := dec.Decode(&struct{}{}); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil && isTooLarge(err):
		return decodeError(err, limit)
	default:
		return warehouse.Errorf(warehouse.CodeInvalid, "The body must hold one JSON object and nothing after it.")
	}
}

func isTooLarge(err error) bool {
	_, ok := errors.AsType[*http.MaxBytesError](err)
	return ok
}

// decodeError explains a failure of json.Decoder.Decode as a domain error.
func decodeError(err error, limit int64) error {
	if isTooLarge(err) {
		return warehouse.Errorf(warehouse.CodeTooLarge, "The body must be at most %d bytes.", limit)
	}
	if errors.Is(err, io.EOF) {
		return warehouse.Errorf(warehouse.CodeInvalid, "The body is empty; it must be a JSON object.")
	}
	if typeErr, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if typeErr.Field == "" {
			return warehouse.Errorf(warehouse.CodeInvalid, "The body must be a JSON object, not a %s.", typeErr.Value)
		}
		return &warehouse.Error{Code: warehouse.CodeValidation, Message: "The request has invalid fields.",
			Fields: []warehouse.FieldError{{Field: typeErr.Field, Message: fieldTypeMessage(typeErr)}}}
	}
	if syntaxErr, ok := errors.AsType[*json.SyntaxError](err); ok {
		return warehouse.Errorf(warehouse.CodeInvalid, "The body is not valid JSON (at byte %d): %v.", syntaxErr.Offset, syntaxErr)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return warehouse.Errorf(warehouse.CodeInvalid, "The body is not valid JSON: it ends too early.")
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return warehouse.Errorf(warehouse.CodeInvalid, "The body has an unknown field %s.", field)
	}
	return warehouse.Errorf(warehouse.CodeInvalid, "The body could not be read as JSON: %v.", err)
}

func fieldTypeMessage(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind().String() {
	case "int64":
		return fmt.Sprintf("must be an integer from 0 to %d, not %s", warehouse.MaxAvailable, e.Value)
	case "string":
		return "must be a string, not " + e.Value
	}
	return "has the wrong type: " + e.Value
}
