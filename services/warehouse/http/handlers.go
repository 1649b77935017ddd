package http

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/outboxshop/outboxshop/internal/httpapi"
	"github.com/outboxshop/outboxshop/internal/input"
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

// StockList is the body of GET /stock: a page of SKUs in SKU order.
type StockList struct {
	Items []StockItem `json:"items"`
	// Next is the URL of the next page; empty on the last one.
	Next string `json:"next,omitempty"`
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

// listStock answers a page of SKUs. The cursor is opaque to the client: the last SKU of the
// previous page, base64url-encoded; pages follow the primary key, so a SKU created or changed
// meanwhile never makes another one appear twice or not at all.
func (s *server) listStock(w http.ResponseWriter, r *http.Request) {
	limit, after, err := pageParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	items, err := s.cfg.Store.ListStock(ctx, after, limit+1) // one more: is there a next page?
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := StockList{Items: make([]StockItem, 0, min(len(items), limit))}
	for _, i := range items[:min(len(items), limit)] {
		out.Items = append(out.Items, toStockItem(i))
	}
	if len(items) > limit {
		q := url.Values{"limit": {strconv.Itoa(limit)}, "cursor": {base64.RawURLEncoding.EncodeToString([]byte(items[limit-1].SKU))}}
		out.Next = "/stock?" + q.Encode()
		w.Header().Set("Link", "<"+out.Next+">; rel=\"next\"")
	}
	writeJSON(w, http.StatusOK, out)
}

// pageParams reads GET /stock's limit (1 to MaxPageSize, default DefaultPageSize) and cursor
// (from a "next" link: the SKU the page starts after).
func pageParams(r *http.Request) (limit int, after string, err error) {
	q := r.URL.Query()
	limit = DefaultPageSize
	switch v := q["limit"]; {
	case len(v) > 1:
		return 0, "", warehouse.Errorf(warehouse.CodeBadQuery, "Send limit at most once.")
	case len(v) == 1:
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > MaxPageSize {
			return 0, "", warehouse.Errorf(warehouse.CodeBadQuery, "limit must be an integer from 1 to %d.", MaxPageSize)
		}
		limit = n
	}
	switch v := q["cursor"]; {
	case len(v) > 1:
		return 0, "", warehouse.Errorf(warehouse.CodeBadQuery, "Send cursor at most once.")
	case len(v) == 1:
		sku, err := base64.RawURLEncoding.DecodeString(v[0])
		if err != nil || !warehouse.ValidSKU(string(sku)) {
			return 0, "", warehouse.Errorf(warehouse.CodeBadQuery, "cursor is not one this API gave: take it from the \"next\" of the previous page.")
		}
		after = string(sku)
	}
	return limit, after, nil
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
	w.Header().Set("ETag", etag(item.Version))
	writeJSON(w, http.StatusOK, toStockItem(item))
}

func (s *server) putStock(w http.ResponseWriter, r *http.Request) {
	sku := chi.URLParam(r, "sku")
	pre, err := precondition(r, sku)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req PutStockRequest
	if err := httpapi.DecodeJSON(w, r, s.cfg.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, warehouse.FromInput(err))
		return
	}
	name, err := validatePutStock(sku, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	item, created, err := s.cfg.Store.SetStockIf(ctx, sku, name, *req.Available, pre)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.InfoContext(r.Context(), "stock set", requestAttr(r), "sku", sku, "available", item.Available, "created", created)
	w.Header().Set("ETag", etag(item.Version))
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/stock/"+sku)
	}
	writeJSON(w, status, toStockItem(item))
}

// etag is the entity tag of a SKU's stock at version.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// noVersion matches no SKU: the version of an If-Match that names none of ours.
const noVersion = -1

// precondition reads PUT /stock/{sku}'s If-Match and If-None-Match (RFC 9110, section 13).
// One of them is required (428 without): If-Match with the ETags of GET /stock/{sku}, or *
// for any current level; If-None-Match: * to create a SKU that must not exist. A weak ETag
// never matches (If-Match compares strongly), nor does one this API did not give.
func precondition(r *http.Request, sku string) (warehouse.Precondition, error) {
	var pre warehouse.Precondition
	ifMatch, hasMatch := r.Header["If-Match"]
	ifNoneMatch, hasNoneMatch := r.Header["If-None-Match"]
	if !hasMatch && !hasNoneMatch {
		return pre, warehouse.Errorf(warehouse.CodePreconditionRequired,
			"PUT /stock/%s needs If-Match with the ETag of GET /stock/%s (a write based on an older read would overwrite the reservations made since), "+
				"If-Match: * to set the level whatever it is now, or If-None-Match: * to create a new SKU.", sku, sku)
	}
	if hasMatch {
		tags, err := entityTags(ifMatch)
		if err != nil {
			return pre, err
		}
		for _, tag := range tags {
			if tag == "*" {
				pre.Exists = true
				continue
			}
			if v, err := strconv.ParseInt(strings.Trim(tag, `"`), 10, 64); err == nil && v > 0 {
				pre.Versions = append(pre.Versions, v)
			}
		}
		if !pre.Exists && len(pre.Versions) == 0 {
			pre.Versions = []int64{noVersion}
		}
	}
	if hasNoneMatch {
		if tags, err := entityTags(ifNoneMatch); err != nil || len(tags) != 1 || tags[0] != "*" {
			return pre, warehouse.Errorf(warehouse.CodeBadHeader, "If-None-Match on PUT /stock/{sku} must be *: create the SKU only if it does not exist.")
		}
		pre.Absent = true
	}
	return pre, nil
}

// entityTags splits the values of an If-Match or If-None-Match header into "*" and entity
// tags ("…" or W/"…"; weak ones are dropped), refusing anything else.
func entityTags(values []string) ([]string, error) {
	var tags []string
	for _, v := range values {
		for tag := range strings.SplitSeq(v, ",") {
			tag = strings.TrimSpace(tag)
			weak := strings.HasPrefix(tag, "W/")
			opaque := strings.TrimPrefix(tag, "W/")
			switch {
			case tag == "*":
				tags = append(tags, tag)
			case len(opaque) >= 2 && opaque[0] == '"' && opaque[len(opaque)-1] == '"' && !strings.Contains(opaque[1:len(opaque)-1], `"`) &&
				input.VisibleASCII(opaque, 256):
				if !weak {
					tags = append(tags, opaque)
				}
			default:
				return nil, warehouse.Errorf(warehouse.CodeBadHeader, "%q is not an entity tag: send the ETag of GET /stock/{sku} as it was given, quotes included.", tag)
			}
		}
	}
	return tags, nil
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
		case input.IdentifierProblem(*req.Name) != "": // before trimming, which removes some controls
			fields = append(fields, warehouse.FieldError{Field: "name", Message: input.IdentifierProblem(*req.Name)})
		case name == "":
			fields = append(fields, warehouse.FieldError{Field: "name", Message: "must not be empty when given"})
		case utf8.RuneCountInString(name) > warehouse.MaxNameLength:
			fields = append(fields, warehouse.FieldError{Field: "name",
				Message: fmt.Sprintf("must be at most %d characters", warehouse.MaxNameLength)})
		}
	}
	if len(fields) > 0 {
		return "", &warehouse.Error{Code: warehouse.CodeValidation, Message: "The request has invalid fields.", Fields: fields}
	}
	return name, nil
}

func (s *server) getReservation(w http.ResponseWriter, r *http.Request) {
	raw := chi.URLParam(r, "order_id")
	id, ok := input.ParseID(raw)
	if !ok {
		s.fail(w, r, warehouse.Errorf(warehouse.CodeNotFound, "No reservation for order %q: order ids are lowercase UUIDs (8-4-4-4-12).", raw))
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
