-- The warehouse's own tables. The outbox and inbox tables come from pkg/outbox and pkg/inbox.

-- stock: one row per SKU. available is what can still be reserved; what RESERVED
-- reservations hold is not part of it (see reservation_lines).
CREATE TABLE stock (
    sku        text        PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    available  bigint      NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- reservations: what the warehouse did for one order, at most one row per order.
CREATE TABLE reservations (
    order_id             uuid        PRIMARY KEY,
    status               text        NOT NULL CHECK (status IN ('RESERVED', 'REJECTED', 'RELEASED', 'CANCELLED')),
    reason               text        NOT NULL DEFAULT '',
    -- The OrderCreated and OrderCancelled messages that acted on the order (NULL: none yet).
    created_message_id   text,
    cancelled_message_id text,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL
);

-- Only RESERVED rows hold stock; GET /stock sums their lines.
CREATE INDEX reservations_reserved ON reservations (order_id) WHERE status = 'RESERVED';

-- reservation_lines: the order's lines, merged per SKU. They are held only while the
-- reservation is RESERVED. No foreign key to stock: a rejected order may name unknown SKUs.
CREATE TABLE reservation_lines (
    order_id uuid   NOT NULL REFERENCES reservations (order_id) ON DELETE CASCADE,
    sku      text   NOT NULL,
    quantity bigint NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);

CREATE INDEX reservation_lines_sku ON reservation_lines (sku);

-- stock_movements: the ledger. Every change of stock.available is one row, so that for every
-- SKU available = sum(delta), and every order's effect is visible: one 'reserve' row per
-- line when it was reserved, one 'release' row per line when it was released, never more
-- (stock_movements_once).
CREATE TABLE stock_movements (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sku        text        NOT NULL REFERENCES stock (sku),
    delta      bigint      NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('reserve', 'release', 'restock', 'set')),
    order_id   uuid        REFERENCES reservations (order_id),
    -- The consumed message (reserve, release) that caused the movement.
    message_id text,
    at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_movements_order CHECK ((kind IN ('reserve', 'release')) = (order_id IS NOT NULL)),
    CONSTRAINT stock_movements_sign CHECK (
        (kind = 'reserve' AND delta < 0) OR (kind = 'release' AND delta > 0) OR kind IN ('restock', 'set'))
);

CREATE UNIQUE INDEX stock_movements_once ON stock_movements (order_id, sku, kind) WHERE order_id IS NOT NULL;
CREATE INDEX stock_movements_sku ON stock_movements (sku, id);
