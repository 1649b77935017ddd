package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/services/warehouse"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// Exchange is the events exchange the outbox publishes the answers (StockReserved,
	// StockRejected, StockReleased) to. Required.
	Exchange string
	// Propagator records the trace context of the writing ctx in each answer's headers
	// (outbox.Store.WithPropagator); give the relay the same one. nil: the global one.
	Propagator propagation.TextMapPropagator
}

// Store is the warehouse's PostgreSQL store: the stock behind the HTTP API and the seed
// command, and the orders' events applied inside the consumer's transaction
// ([Store.ApplyOrderCreated], [Store.ApplyOrderCancelled]), which write the stock change and
// its answer (outbox.QueueAdd, sent with the change) in that one transaction. Every method
// returns a *warehouse.Error with CodeUnavailable when the database cannot be reached.
//
// Every method whose result the API answers (or the seed command prints) runs in a
// transaction committed through pgdb.InTx (outbox.CommitReplicated), reads included, as the
// orders service's do: a nil error means the result is on the synchronous standbys, if the
// server has any, and survives a failover (docs/failover.md). A plain commit of a read waits
// for no standby, yet it may read a stock level or a version (the ETag a client sends back
// in If-Match) committed on the primary alone. Available, read for a gauge, answers nobody.
type Store struct {
	pool     *pgxpool.Pool
	now      func() time.Time
	exchange string
	outbox   *outbox.Store
}

// NewStore returns the store on pool, which must be migrated (Migrate).
func NewStore(pool *pgxpool.Pool, cfg StoreConfig) (*Store, error) {
	if cfg.Exchange == "" {
		return nil, errors.New("postgres store: Exchange is required")
	}
	ob, err := outbox.NewStore(outbox.Tables{})
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	return &Store{
		pool: pool, now: func() time.Time { return time.Now().UTC() },
		exchange: cfg.Exchange, outbox: ob.WithPropagator(cfg.Propagator),
	}, nil
}

// readOnly are the options of the transactions that only read for an answer.
var readOnly = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return dbError("ping", s.pool.Ping(ctx))
}

// ListStock returns up to limit SKUs that sort after the SKU after ("" for the first page),
// in SKU order, with what is reserved of each.
func (s *Store) ListStock(ctx context.Context, after string, limit int) ([]warehouse.StockItem, error) {
	var items []warehouse.StockItem
	err := pgdb.InTx(ctx, s.pool, readOnly, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, selectStockPageSQL, after, limit)
		if err != nil {
			return err
		}
		items, err = pgx.CollectRows(rows, pgx.RowToStructByPos[warehouse.StockItem])
		return err
	})
	if err != nil {
		return nil, dbError("list stock", err)
	}
	return items, nil
}

// Available returns the available stock of those of skus that exist, by SKU: one cheap
// query, without locks, for the stock gauge. It answers no client, so it does not wait for
// the synchronous standby: a gauge may show a level that a failover then undoes.
func (s *Store) Available(ctx context.Context, skus []string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, selectAvailableSQL, skus)
	if err != nil {
		return nil, dbError("read available stock", err)
	}
	out := make(map[string]int64, len(skus))
	var (
		sku       string
		available int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&sku, &available}, func() error {
		out[sku] = available
		return nil
	}); err != nil {
		return nil, dbError("read available stock", err)
	}
	return out, nil
}

// GetStock returns one SKU, or an error with CodeNotFound, once the standby has it (its
// version is the ETag of GET /stock/{sku}).
func (s *Store) GetStock(ctx context.Context, sku string) (warehouse.StockItem, error) {
	var item warehouse.StockItem
	err := pgdb.InTx(ctx, s.pool, readOnly, func(tx pgx.Tx) error {
		var err error
		item, err = getStock(ctx, tx, sku)
		return err
	})
	if err != nil {
		return warehouse.StockItem{}, dbError("get stock", err)
	}
	return item, nil
}

func getStock(ctx context.Context, db DBTX, sku string) (warehouse.StockItem, error) {
	rows, err := db.Query(ctx, selectOneStockSQL, sku)
	if err != nil {
		return warehouse.StockItem{}, dbError("get stock", err)
	}
	item, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[warehouse.StockItem])
	if errors.Is(err, pgx.ErrNoRows) {
		return warehouse.StockItem{}, warehouse.Errorf(warehouse.CodeNotFound, "SKU %q does not exist.", sku)
	}
	if err != nil {
		return warehouse.StockItem{}, dbError("get stock", err)
	}
	return item, nil
}

// SetStock sets the available stock of a SKU unconditionally: SetStockIf without a
// precondition.
func (s *Store) SetStock(ctx context.Context, sku, name string, available int64) (warehouse.StockItem, bool, error) {
	return s.SetStockIf(ctx, sku, name, available, warehouse.Precondition{})
}

// SetStockIf sets the available stock of a SKU when the SKU as it is satisfies pre (an
// error with CodePreconditionFailed otherwise, and nothing written), creating the SKU when it
// is new, and writes a 'set' ledger row with the difference. The row is locked before pre is
// checked, so a reservation cannot slip in between. name, when not empty, renames the SKU; a
// new SKU without a name is named after itself. It reports whether the SKU was created. The
// caller has validated sku, name and available.
//
// The SKU it returns (the answer and its ETag) is read in the same transaction, which
// commits through pgdb.InTx: it is returned only once the standby has it.
func (s *Store) SetStockIf(ctx context.Context, sku, name string, available int64, pre warehouse.Precondition) (item warehouse.StockItem, created bool, err error) {
	now := s.now()
	err = pgdb.InTx(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		if created, err = setStock(ctx, tx, sku, name, available, pre, now); err != nil {
			return err
		}
		item, err = getStock(ctx, tx, sku)
		return err
	})
	if err != nil {
		return warehouse.StockItem{}, false, dbError("set stock", err)
	}
	return item, created, nil
}

// setStock is SetStockIf's write, in tx; it reports whether it created the SKU.
func setStock(ctx context.Context, tx pgx.Tx, sku, name string, available int64, pre warehouse.Precondition, now time.Time) (created bool, err error) {
	// Not a retry loop: every error returns at once (the request answers 503 when it is
	// transient). It goes round again only when another request created the SKU between the
	// lock and the insert, and then finds the row: at most twice, since stock rows are never
	// deleted.
	for {
		var (
			oldName      string
			old, version int64
		)
		err := tx.QueryRow(ctx, lockOneStockSQL, sku).Scan(&oldName, &old, &version)
		if errors.Is(err, pgx.ErrNoRows) {
			if err := pre.Check(sku, false, 0); err != nil {
				return false, err
			}
			newName := name
			if newName == "" {
				newName = sku
			}
			tag, err := tx.Exec(ctx, insertStockSQL, sku, newName, available, now)
			if err != nil {
				return false, dbError("insert stock", err)
			}
			if tag.RowsAffected() == 0 {
				continue // created meanwhile by another request: lock it and check again
			}
			_, err = tx.Exec(ctx, insertMovementSQL, sku, available, kindSet, now)
			return true, dbError("insert stock movement", err)
		}
		if err != nil {
			return false, dbError("lock stock", err)
		}
		if err := pre.Check(sku, true, version); err != nil {
			return false, err
		}
		if name == "" {
			name = oldName
		}
		if _, err := tx.Exec(ctx, updateStockSQL, sku, name, available, now); err != nil {
			return false, dbError("update stock", err)
		}
		_, err = tx.Exec(ctx, insertMovementSQL, sku, available-old, kindSet, now)
		return false, dbError("insert stock movement", err)
	}
}

// GetReservation returns the reservation of an order with its lines, or an error with
// CodeNotFound, once the standby has it.
func (s *Store) GetReservation(ctx context.Context, orderID uuid.UUID) (warehouse.Reservation, error) {
	var r warehouse.Reservation
	err := pgdb.InTx(ctx, s.pool, readOnly, func(tx pgx.Tx) error {
		var err error
		r, err = GetReservation(ctx, tx, orderID)
		return err
	})
	if err != nil {
		return warehouse.Reservation{}, dbError("get reservation", err)
	}
	return r, nil
}

// SeedChange is one SKU the seed changed.
type SeedChange struct {
	SKU      string
	From, To int64
}

// Seed resets the stock of the catalogue's SKUs to warehouse.Catalogue (creating missing
// ones, restoring names) and writes a 'restock' ledger row for each level it changes. Other
// SKUs are left alone. When reservations hold stock it refuses with CodeConflict, unless
// force is set: the held stock then comes on top of the catalogue levels when released.
func (s *Store) Seed(ctx context.Context, force bool) ([]SeedChange, error) {
	now := s.now()
	skus := make([]string, len(warehouse.Catalogue))
	names := make([]string, len(warehouse.Catalogue))
	levels := make([]int64, len(warehouse.Catalogue))
	target := make(map[string]int64, len(warehouse.Catalogue))
	for i, c := range warehouse.Catalogue {
		skus[i], names[i], levels[i] = c.SKU, c.Name, c.Available
		target[c.SKU] = c.Available
	}
	var changes []SeedChange
	err := pgdb.InTx(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		changes = nil
		if _, err := tx.Exec(ctx, insertMissingStockSQL, skus, names, now); err != nil {
			return dbError("create catalogue SKUs", err)
		}
		// Locking the rows first makes the count below see every reservation of these SKUs
		// that committed before.
		rows, err := tx.Query(ctx, lockStockNamesSQL, skus)
		if err != nil {
			return dbError("lock catalogue stock", err)
		}
		var (
			sku, name string
			old       int64
		)
		_, err = pgx.ForEachRow(rows, []any{&sku, &name, &old}, func() error {
			if old != target[sku] {
				changes = append(changes, SeedChange{SKU: sku, From: old, To: target[sku]})
			}
			return nil
		})
		if err != nil {
			return dbError("lock catalogue stock", err)
		}
		var held int64
		if err := tx.QueryRow(ctx, countHeldSQL).Scan(&held); err != nil {
			return dbError("count reservations", err)
		}
		if held > 0 && !force {
			return warehouse.Errorf(warehouse.CodeConflict,
				"%d reservations hold stock; seeding now would change stock under them (use --force to seed anyway)", held)
		}
		if _, err := tx.Exec(ctx, setStockSQL, skus, names, levels, now); err != nil {
			return dbError("set catalogue stock", err)
		}
		for _, c := range changes {
			if _, err := tx.Exec(ctx, insertMovementSQL, c.SKU, c.To-c.From, kindRestock, now); err != nil {
				return dbError("insert stock movement", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, dbError("seed", err)
	}
	return changes, nil
}

// Verify checks the ledger against the state and returns every inconsistency it finds (none
// in a healthy database): for each SKU, available equals the sum of its movements; each
// RESERVED order has exactly one 'reserve' movement per line, of its quantity, and no
// 'release'; each RELEASED order has one 'reserve' and one 'release' per line that cancel
// out; REJECTED and CANCELLED orders have no movements. A chaos test calls it to prove that
// every order's effect was applied exactly once.
func Verify(ctx context.Context, db DBTX) ([]string, error) {
	var problems []string
	for _, check := range []struct{ name, sql string }{
		{"stock differs from its ledger", verifyStockSQL},
		{"order's movements do not match its reservation", verifyOrdersSQL},
	} {
		rows, err := db.Query(ctx, check.sql)
		if err != nil {
			return nil, dbError("verify", err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, dbError("verify", err)
		}
		for _, f := range found {
			problems = append(problems, fmt.Sprintf("%s: %s", check.name, f))
		}
	}
	return problems, nil
}
