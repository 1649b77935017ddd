// Package payments is the producer. It captures payments over HTTP and writes each payment
// and its PaymentCaptured event in one transaction, the event into the outbox: both commit,
// or neither. A relay, in this process or another, publishes the outbox to RabbitMQ.
//
// Its tables live in schema payments: its own (schema.sql) and the outbox's, named by an
// [outbox.Store], so that they never meet another service's tables in a shared database.
package payments

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxshop/outboxshop/pkg/outbox"

	"example.com/billing/events"
)

//go:embed schema.sql
var schema string

const insertPayment = `INSERT INTO payments.payments (id, account, amount_cents) VALUES ($1, $2, $3)`

// ErrInvalid is wrapped by the error [Service.Capture] returns for a payment it refuses.
var ErrInvalid = errors.New("invalid payment")

// Service captures payments. It is an [http.Handler] for POST /payments.
type Service struct {
	pool   *pgxpool.Pool
	outbox *outbox.Store
	topo   events.Topology
	logger *slog.Logger
	mux    *http.ServeMux
}

// New returns the service on pool, publishing to topo.Exchange. A nil logger discards.
func New(pool *pgxpool.Pool, topo events.Topology, logger *slog.Logger) (*Service, error) {
	store, err := outbox.NewStore(outbox.Tables{Schema: "payments"})
	if err != nil {
		return nil, fmt.Errorf("outbox store: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{pool: pool, outbox: store, topo: topo, logger: logger, mux: http.NewServeMux()}
	s.mux.HandleFunc("POST /payments", s.handleCapture)
	return s, nil
}

// Migrate creates the outbox (and schema payments), then the service's table. Every
// process calls it at start-up; once the schema is current it changes nothing.
func (s *Service) Migrate(ctx context.Context) error {
	if err := s.outbox.Migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("migrate outbox: %w", err)
	}
	if _, err := s.pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create payments table: %w", err)
	}
	return nil
}

// Capture records a payment of amountCents to account, and its PaymentCaptured event, in one
// transaction. It returns an error wrapping [ErrInvalid] for a payment it refuses.
func (s *Service) Capture(ctx context.Context, account string, amountCents int64) (events.Payment, error) {
	if len(account) == 0 || len(account) > 64 || !utf8.ValidString(account) || strings.ContainsRune(account, 0) {
		return events.Payment{}, fmt.Errorf("%w: account must be 1 to 64 bytes of UTF-8 without NUL", ErrInvalid)
	}
	if amountCents <= 0 {
		return events.Payment{}, fmt.Errorf("%w: amount_cents must be positive", ErrInvalid)
	}
	p := events.Payment{ID: "pay_" + rand.Text(), Account: account, AmountCents: amountCents}
	payload, err := json.Marshal(p)
	if err != nil {
		return events.Payment{}, fmt.Errorf("encode payment: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertPayment, p.ID, p.Account, p.AmountCents); err != nil {
			return fmt.Errorf("insert payment: %w", err)
		}
		return s.outbox.Add(ctx, tx, outbox.Message{
			Exchange:   s.topo.Exchange,
			RoutingKey: events.PaymentCaptured,
			Type:       events.PaymentCaptured,
			// The events of one account are published in the order they were captured.
			AggregateType: "account",
			AggregateID:   p.Account,
			Payload:       payload,
		})
	})
	if err != nil {
		// A commit that failed may still have committed (the connection broke after the
		// server received it). The caller sees an error and may capture again: a real
		// service takes an idempotency key from the client for that.
		return events.Payment{}, fmt.Errorf("capture payment %s: %w", p.ID, err)
	}
	s.logger.InfoContext(ctx, "payment captured", "payment_id", p.ID, "account", p.Account, "amount_cents", p.AmountCents)
	return p, nil
}

// Relay returns a relay that publishes the service's outbox through pub. cfg sets everything
// but the tables (a logger, hooks, batch size); run the relay in one or more processes.
func (s *Service) Relay(pub outbox.Publisher, cfg outbox.Config) (*outbox.Relay, error) {
	cfg.Tables = s.outbox.Tables()
	relay, err := outbox.NewRelay(s.pool, pub, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	return relay, nil
}

// RunCleanup deletes published outbox rows older than a week until ctx ends. Run it in one
// process.
func (s *Service) RunCleanup(ctx context.Context) error {
	return s.outbox.RunCleanup(ctx, s.pool, outbox.CleanupConfig{Logger: s.logger})
}

// Pending returns how many outbox rows wait for the relay.
func (s *Service) Pending(ctx context.Context) (int64, error) {
	stats, err := s.outbox.ReadStats(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("outbox stats: %w", err)
	}
	return stats.Pending, nil
}

// ServeHTTP serves POST /payments, {"account": "alice", "amount_cents": 1250}, answering 201
// with the payment.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

func (s *Service) handleCapture(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Account     string `json:"account"`
		AmountCents int64  `json:"amount_cents"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		http.Error(w, "decode body: "+err.Error(), http.StatusBadRequest)
		return
	}
	p, err := s.Capture(r.Context(), req.Account, req.AmountCents)
	switch {
	case errors.Is(err, ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case err != nil:
		s.logger.ErrorContext(r.Context(), "capture payment", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(p) // the payment is captured: a client gone away changes nothing
}
