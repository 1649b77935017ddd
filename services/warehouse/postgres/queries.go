package postgres

// The SQL of the package, parameterised. Arrays travel as text[] and bigint[] and are
// unnested, so that one statement handles every line of an order.

// Orders.
const (
	// lockOrderSQL serialises the transactions of one order (two-key form: its own key space,
	// apart from the single-key migration locks).
	lockOrderSQL = `SELECT pg_advisory_xact_lock($1, hashtext($2))`

	selectReservationSQL = `SELECT status, reason, coalesce(created_message_id, ''), coalesce(cancelled_message_id, ''),
       created_at, updated_at
FROM reservations WHERE order_id = $1`
	selectReservationLinesSQL = `SELECT sku, quantity FROM reservation_lines WHERE order_id = $1 ORDER BY sku`

	insertReservationSQL = `INSERT INTO reservations
    (order_id, status, reason, created_message_id, cancelled_message_id, created_at, updated_at)
VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), $6, $6)`
	insertReservationLinesSQL = `INSERT INTO reservation_lines (order_id, sku, quantity)
SELECT $1, v.sku, v.quantity FROM unnest($2::text[], $3::bigint[]) AS v (sku, quantity)`

	// markCreatedSQL records the late OrderCreated of a tombstone.
	markCreatedSQL = `UPDATE reservations SET created_message_id = $2, updated_at = $3 WHERE order_id = $1`
	// markCancelledSQL records an OrderCancelled and sets the status (unchanged for a
	// rejected order, RELEASED for a reserved one).
	markCancelledSQL = `UPDATE reservations
SET status = $2, reason = $3, cancelled_message_id = $4, updated_at = $5
WHERE order_id = $1`
)

// Stock.
const (
	// lockStockSQL locks the rows of the given SKUs in one order for every transaction, so
	// that two transactions never wait for each other in a cycle.
	lockStockSQL = `SELECT sku, available FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE`

	// takeStockSQL takes $2 of SKU $1 if there is that much and order $4 has no reservation
	// yet: one row changed, else none (short, unknown, or an order seen before). The
	// reservation's lines run it in SKU order, after the order's lock.
	takeStockSQL = `UPDATE stock SET available = available - $2, updated_at = $3
WHERE sku = $1 AND available >= $2 AND NOT EXISTS (SELECT FROM reservations WHERE order_id = $4)`
	// takeStockSavepointSQL and takeStockRollbackSQL make an order's takeStockSQL all or
	// nothing when one of its lines is short.
	takeStockSavepointSQL = `SAVEPOINT take_stock`
	takeStockRollbackSQL  = `ROLLBACK TO SAVEPOINT take_stock`

	// addStockSQL adds deltas (negative to reserve) to the given SKUs.
	addStockSQL = `UPDATE stock AS s SET available = s.available + v.delta, updated_at = $3
FROM unnest($1::text[], $2::bigint[]) AS v (sku, delta)
WHERE s.sku = v.sku`

	insertMovementsSQL = `INSERT INTO stock_movements (sku, delta, kind, order_id, message_id, at)
SELECT v.sku, v.delta, $3, $4, NULLIF($5, ''), $6 FROM unnest($1::text[], $2::bigint[]) AS v (sku, delta)`

	// selectStockSQL reads SKUs with what RESERVED reservations hold of each (through the
	// index on reservation_lines.sku, per row: a page costs its rows, not the table).
	selectStockSQL = `SELECT s.sku, s.name, s.available,
       coalesce((SELECT sum(l.quantity)
                 FROM reservation_lines AS l
                 JOIN reservations AS r ON r.order_id = l.order_id AND r.status = 'RESERVED'
                 WHERE l.sku = s.sku), 0)::bigint,
       s.updated_at, s.version
FROM stock AS s`
	// selectStockPageSQL is a page of SKUs in SKU order, after $1 (keyset pagination on the
	// primary key: stable while rows are added or changed).
	selectStockPageSQL = selectStockSQL + ` WHERE s.sku > $1 ORDER BY s.sku LIMIT $2`
	selectOneStockSQL  = selectStockSQL + ` WHERE s.sku = $1`

	// selectAvailableSQL reads the available stock of the given SKUs, without locking.
	selectAvailableSQL = `SELECT sku, available FROM stock WHERE sku = ANY($1::text[])`

	lockOneStockSQL   = `SELECT name, available, version FROM stock WHERE sku = $1 FOR UPDATE`
	insertStockSQL    = `INSERT INTO stock (sku, name, available, updated_at) VALUES ($1, $2, $3, $4) ON CONFLICT (sku) DO NOTHING`
	updateStockSQL    = `UPDATE stock SET name = $2, available = $3, updated_at = $4 WHERE sku = $1`
	insertMovementSQL = `INSERT INTO stock_movements (sku, delta, kind, at) VALUES ($1, $2, $3, $4)`

	// insertMissingStockSQL creates the SKUs of the catalogue that do not exist, with no
	// stock; the seed then sets their level like any other's.
	insertMissingStockSQL = `INSERT INTO stock (sku, name, available, updated_at)
SELECT v.sku, v.name, 0, $3 FROM unnest($1::text[], $2::text[]) AS v (sku, name)
ON CONFLICT (sku) DO NOTHING`
	lockStockNamesSQL = `SELECT sku, name, available FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE`
	setStockSQL       = `UPDATE stock AS s SET name = v.name, available = v.available, updated_at = $4
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v (sku, name, available)
WHERE s.sku = v.sku`
	countHeldSQL = `SELECT count(*) FROM reservations WHERE status = 'RESERVED'`
)

// Movement kinds (stock_movements.kind).
const (
	kindReserve = "reserve"
	kindRelease = "release"
	kindRestock = "restock"
	kindSet     = "set"
)

// orderLockClass is the first key of lockOrderSQL ("WHOU").
const orderLockClass int32 = 0x57484f55

// Verify.
const (
	verifyStockSQL = `SELECT format('%s: available %s, ledger %s', s.sku, s.available, coalesce(m.total, 0))
FROM stock AS s
LEFT JOIN (SELECT sku, sum(delta) AS total FROM stock_movements GROUP BY sku) AS m ON m.sku = s.sku
WHERE s.available <> coalesce(m.total, 0)
ORDER BY s.sku`

	// Per order and SKU: the expected reserve and release amounts from the reservation, and
	// the actual ones from the ledger (with their row counts).
	verifyOrdersSQL = `WITH expected AS (
    SELECT r.order_id, l.sku, r.status,
           CASE WHEN r.status IN ('RESERVED', 'RELEASED') THEN -l.quantity ELSE 0 END AS reserve,
           CASE WHEN r.status = 'RELEASED' THEN l.quantity ELSE 0 END AS release
    FROM reservations AS r JOIN reservation_lines AS l ON l.order_id = r.order_id
), actual AS (
    SELECT order_id, sku,
           coalesce(sum(delta) FILTER (WHERE kind = 'reserve'), 0) AS reserve,
           coalesce(sum(delta) FILTER (WHERE kind = 'release'), 0) AS release,
           count(*) AS moves
    FROM stock_movements WHERE order_id IS NOT NULL
    GROUP BY order_id, sku
)
SELECT format('order %s sku %s (%s): reserve %s/%s, release %s/%s',
              coalesce(e.order_id, a.order_id), coalesce(e.sku, a.sku), coalesce(e.status, 'no reservation line'),
              coalesce(a.reserve, 0), coalesce(e.reserve, 0), coalesce(a.release, 0), coalesce(e.release, 0))
FROM expected AS e
FULL JOIN actual AS a ON a.order_id = e.order_id AND a.sku = e.sku
WHERE coalesce(a.reserve, 0) <> coalesce(e.reserve, 0)
   OR coalesce(a.release, 0) <> coalesce(e.release, 0)
ORDER BY 1`
)
