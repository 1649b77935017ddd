package postgres

// The Store's statements. Every value is a parameter.
const (
	selectProducts = `SELECT sku, name FROM products WHERE sku = ANY($1::text[])`

	insertOrder = `INSERT INTO orders (id, customer_id, status) VALUES ($1, $2, $3)`

	insertOrderLines = `INSERT INTO order_lines (order_id, line_no, sku, quantity)
SELECT $1, l.line_no - 1, l.sku, l.quantity
FROM unnest($2::text[], $3::integer[]) WITH ORDINALITY AS l (sku, quantity, line_no)`

	insertHistory = `INSERT INTO order_status_history (order_id, from_status, to_status, event, reason, message_id)
VALUES ($1, NULLIF($2, ''), $3, $4, NULLIF($5, ''), NULLIF($6, ''))`

	selectOrder = `SELECT id, customer_id, status, created_at, updated_at FROM orders WHERE id = $1`

	selectOrderStatusForUpdate = `SELECT status FROM orders WHERE id = $1 FOR UPDATE`

	updateOrderStatus = `UPDATE orders SET status = $2, updated_at = now() WHERE id = $1 RETURNING updated_at`

	selectOrderLines = `SELECT l.sku, p.name, l.quantity
FROM order_lines l JOIN products p ON p.sku = l.sku
WHERE l.order_id = $1
ORDER BY l.line_no`

	selectOrderHistory = `SELECT coalesce(from_status, ''), to_status, event, coalesce(reason, ''), coalesce(message_id, ''), at
FROM order_status_history
WHERE order_id = $1
ORDER BY id`

	// insertIdempotencyKey claims a key. When another transaction inserted the same key and has
	// not finished, it waits on the primary key until that one commits (then inserts nothing)
	// or rolls back (then inserts).
	insertIdempotencyKey = `INSERT INTO idempotency_keys (key, request_hash) VALUES ($1, $2)
ON CONFLICT (key) DO NOTHING`

	selectIdempotencyKey = `SELECT request_hash, order_id, response_status, response_body
FROM idempotency_keys WHERE key = $1`

	updateIdempotencyKey = `UPDATE idempotency_keys
SET order_id = $2, response_status = $3, response_body = $4
WHERE key = $1`

	deleteIdempotencyKeys = `DELETE FROM idempotency_keys
WHERE key IN (
    SELECT key FROM idempotency_keys
    WHERE created_at < now() - $1::interval
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)`
)
