// Package fakeshop is an in-memory stand-in for the orders API (services/orders/README.md),
// for the tests of loadgen: POST /orders with its Idempotency-Key rules and replays, and
// POST /orders/{id}/cancel. Hooks let a test fail, slow down or cut off requests, or break
// the replays.
package fakeshop

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Catalogue is what the fake shop sells.
var Catalogue = map[string]bool{"BOOK-1": true, "MUG-1": true, "TEE-1": true, "PEN-1": true, "BAG-1": true}

// Request is one request the shop received.
type Request struct {
	Method, Path, Key, RequestID string
	Body                         []byte
	Attempt                      int // for POST /orders, the how-manyth with this key (from 1)
}

// Shop is the fake orders API. Its hooks are set with the Set methods, safely at any time.
type Shop struct {
	URL string

	mu       sync.Mutex // guards what follows
	hooks    hooks
	requests []Request
	attempts map[string]int
	answers  map[string]Answer // by Idempotency-Key
	orders   map[string]string // id → Idempotency-Key
	cancels  map[string]int    // id → cancellations received
}

type hooks struct {
	before       func(w http.ResponseWriter, r *http.Request, attempt int) bool
	dropAnswer   func(key string, attempt int) bool
	replay       func(w http.ResponseWriter, stored Answer)
	cancelStatus func(id string) int
}

// SetBefore has f see every POST /orders first; f returning true means it answered (or cut
// the connection) and the shop does nothing more.
func (s *Shop) SetBefore(f func(w http.ResponseWriter, r *http.Request, attempt int) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.before = f
}

// SetDropAnswer: when f is true for a POST /orders, the shop creates (or replays) the order as
// usual but closes the connection instead of answering: the client's answer is lost.
func (s *Shop) SetDropAnswer(f func(key string, attempt int) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.dropAnswer = f
}

// SetReplay has f answer every replay instead of the stored answer: a broken shop.
func (s *Shop) SetReplay(f func(w http.ResponseWriter, stored Answer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.replay = f
}

// SetCancelStatus has f choose the status of each cancellation (default 200; 409, 404, …).
func (s *Shop) SetCancelStatus(f func(id string) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.cancelStatus = f
}

// Answer is a stored first answer.
type Answer struct {
	Fingerprint string
	Body        []byte
	Location    string
	ID          string
}

// New starts a fake shop, closed when the test ends.
func New(t testing.TB) *Shop {
	s, stop := Start()
	t.Cleanup(stop)
	return s
}

// Start starts a fake shop; stop closes it.
func Start() (s *Shop, stop func()) {
	s = &Shop{attempts: map[string]int{}, answers: map[string]Answer{}, orders: map[string]string{}, cancels: map[string]int{}}
	srv := httptest.NewServer(s)
	s.URL = srv.URL
	return s, srv.Close
}

// Requests returns what the shop received so far.
func (s *Shop) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Orders returns the orders created: id → Idempotency-Key.
func (s *Shop) Orders() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.orders))
	for k, v := range s.orders {
		out[k] = v
	}
	return out
}

// Cancels returns the cancellations received by order id.
func (s *Shop) Cancels() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.cancels))
	for k, v := range s.cancels {
		out[k] = v
	}
	return out
}

func (s *Shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	req := Request{Method: r.Method, Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"),
		RequestID: r.Header.Get("X-Request-ID"), Body: body.Bytes()}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		s.mu.Lock()
		if req.Key != "" {
			s.attempts[req.Key]++
			req.Attempt = s.attempts[req.Key]
		}
		s.requests = append(s.requests, req)
		h := s.hooks
		s.mu.Unlock()
		if h.before != nil && h.before(w, r, req.Attempt) {
			return
		}
		s.createOrder(w, r, req, h)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/orders/") && strings.HasSuffix(r.URL.Path, "/cancel"):
		s.mu.Lock()
		s.requests = append(s.requests, req)
		h := s.hooks
		s.mu.Unlock()
		s.cancel(w, strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/orders/"), "/cancel"), h)
	default:
		Problem(w, http.StatusNotFound, "not-found", "No such route.")
	}
}

type orderRequest struct {
	CustomerID string `json:"customer_id"`
	Items      []struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	} `json:"items"`
}

func (s *Shop) createOrder(w http.ResponseWriter, r *http.Request, req Request, h hooks) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		Problem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Content-Type "+ct)
		return
	}
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		Problem(w, http.StatusBadRequest, "invalid-header", "Send at most one Idempotency-Key header.")
		return
	}
	dec := json.NewDecoder(bytes.NewReader(req.Body))
	dec.DisallowUnknownFields()
	var o orderRequest
	if err := dec.Decode(&o); err != nil {
		Problem(w, http.StatusBadRequest, "malformed-body", err.Error())
		return
	}
	if o.CustomerID == "" || len(o.Items) == 0 {
		Problem(w, http.StatusUnprocessableEntity, "validation", "customer_id and items are required")
		return
	}
	for _, it := range o.Items {
		if !Catalogue[it.SKU] || it.Quantity < 1 || it.Quantity > 1000 {
			Problem(w, http.StatusUnprocessableEntity, "validation", fmt.Sprintf("line %s×%d is not valid", it.SKU, it.Quantity))
			return
		}
	}
	fingerprint := string(req.Body)

	s.mu.Lock()
	stored, replay := s.answers[req.Key]
	if !replay {
		id := fmt.Sprintf("00000000-0000-7000-8000-%012d", len(s.orders)+1)
		b, _ := json.Marshal(map[string]any{"id": id, "customer_id": o.CustomerID, "status": "PENDING", "items": o.Items})
		stored = Answer{Fingerprint: fingerprint, Body: append(b, '\n'), Location: "/orders/" + id, ID: id}
		s.orders[id] = req.Key
		if req.Key != "" {
			s.answers[req.Key] = stored
		}
	}
	s.mu.Unlock()

	if replay && stored.Fingerprint != fingerprint {
		Problem(w, http.StatusUnprocessableEntity, "idempotency-key-reuse", "The key was used for another request.")
		return
	}
	if h.dropAnswer != nil && h.dropAnswer(req.Key, req.Attempt) {
		Hangup(w)
		return
	}
	if replay && h.replay != nil {
		h.replay(w, stored)
		return
	}
	w.Header().Set("Location", stored.Location)
	w.Header().Set("Content-Type", "application/json")
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(stored.Body)
}

func (s *Shop) cancel(w http.ResponseWriter, id string, h hooks) {
	s.mu.Lock()
	_, ok := s.orders[id]
	if ok {
		s.cancels[id]++
	}
	s.mu.Unlock()
	if !ok {
		Problem(w, http.StatusNotFound, "not-found", "Order "+id+" does not exist.")
		return
	}
	status := http.StatusOK
	if h.cancelStatus != nil {
		status = h.cancelStatus(id)
	}
	if status != http.StatusOK {
		Problem(w, status, "order-state-conflict", "Order "+id+" is REJECTED.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q,"status":"CANCELLING"}`+"\n", id)
}

// Problem answers an RFC 9457 problem document of type urn:outboxshop:problem:<typ>.
func Problem(w http.ResponseWriter, status int, typ, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "0")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "urn:outboxshop:problem:" + typ, "title": http.StatusText(status), "status": status, "detail": detail,
	})
}

// Hangup closes the connection without an answer.
func Hangup(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(fmt.Sprintf("fakeshop: hijack: %v", err))
	}
	_ = conn.Close()
}
