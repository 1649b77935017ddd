// Package ledger is the consumer. It books each PaymentCaptured event into its journal
// through the inbox: the message id and the booking commit in one transaction, and a message
// the inbox has seen before is acknowledged without booking it again. RabbitMQ and the
// outbox relay both deliver at least once; the ledger books exactly once.
//
// Its tables live in schema ledger: its own (schema.sql) and the inbox's, named by an
// [inbox.Store], so that they never meet another service's tables in a shared database.
package ledger

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq"

	"example.com/billing/events"
)

//go:embed schema.sql
var schema string

const (
	insertEntry   = `INSERT INTO ledger.entries (payment_id, account, amount_cents) VALUES ($1, $2, $3)`
	selectBalance = `SELECT coalesce(sum(amount_cents), 0) FROM ledger.entries WHERE account = $1`
)

// ConsumerName is the ledger's name in its inbox, which deduplicates per name. Keep it
// stable: a new name takes every message as new.
const ConsumerName = "ledger"

// Service books payments.
type Service struct {
	pool   *pgxpool.Pool
	inbox  *inbox.Store
	topo   events.Topology
	logger *slog.Logger
}

// New returns the ledger on pool, consuming topo.Queue. A nil logger discards.
func New(pool *pgxpool.Pool, topo events.Topology, logger *slog.Logger) (*Service, error) {
	store, err := inbox.NewStore(inbox.Tables{Schema: "ledger"})
	if err != nil {
		return nil, fmt.Errorf("inbox store: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{pool: pool, inbox: store, topo: topo, logger: logger}, nil
}

// Migrate creates the inbox (and schema ledger), then the journal. Every process calls it
// at start-up; once the schema is current it changes nothing.
func (s *Service) Migrate(ctx context.Context) error {
	if err := s.inbox.Migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("migrate inbox: %w", err)
	}
	if _, err := s.pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	return nil
}

// Consumer returns the consumer of the ledger's queue. cfg sets the broker and what the
// caller observes (URL, Hooks, Concurrency; Logger defaults to the ledger's); the ledger
// sets the queue, the topology, the inbox and the handler.
func (s *Service) Consumer(cfg inboxrabbitmq.Config) (*inboxrabbitmq.Consumer, error) {
	cfg.Logger = cmp.Or(cfg.Logger, s.logger)
	cfg.Queue = s.topo.Queue
	cfg.Name = ConsumerName
	cfg.Tables = s.inbox.Tables()
	cfg.Setup = s.topo.DeclareQueues
	cfg.DeadLetterRoutingKey = s.topo.DeadLetterQueue // through the default exchange
	// Anything else is dead-lettered before a transaction is opened.
	cfg.Types = []string{events.PaymentCaptured}
	cfg.ContentTypes = []string{events.ContentType}
	cfg.Handler = s.book
	consumer, err := inboxrabbitmq.NewConsumer(s.pool, cfg)
	if err != nil {
		return nil, fmt.Errorf("inbox consumer: %w", err)
	}
	return consumer, nil
}

// book applies one PaymentCaptured event. The consumer calls it only for a message its
// inbox has not recorded, in the transaction that records it, and commits both together;
// it writes through tx only.
func (s *Service) book(ctx context.Context, tx pgx.Tx, d inboxrabbitmq.Delivery) error {
	var p events.Payment
	if err := json.Unmarshal(d.Body, &p); err != nil {
		// No retry can fix the payload: dead-lettered at once, with the reason.
		return inbox.Permanent(fmt.Errorf("decode %s: %w", d.Type, err))
	}
	if _, err := tx.Exec(ctx, insertEntry, p.ID, p.Account, p.AmountCents); err != nil {
		// The consumer sorts the error: the database unreachable is retried in place
		// without counting an attempt; anything else counts one, then dead-letters.
		return fmt.Errorf("book payment %s: %w", p.ID, err)
	}
	return nil
}

// RunCleanup forgets processed message ids older than a week until ctx ends. Run it in one
// process. A duplicate arriving later than that would be booked again.
func (s *Service) RunCleanup(ctx context.Context) error {
	return s.inbox.RunCleanup(ctx, s.pool, inbox.CleanupConfig{Logger: s.logger})
}

// Balance returns the sum of the payments booked to account.
func (s *Service) Balance(ctx context.Context, account string) (int64, error) {
	var cents int64
	if err := s.pool.QueryRow(ctx, selectBalance, account).Scan(&cents); err != nil {
		return 0, fmt.Errorf("balance of %s: %w", account, err)
	}
	return cents, nil
}
