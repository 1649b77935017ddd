-- The orders service's own tables. The outbox and inbox tables come from pkg/outbox and
-- pkg/inbox (outbox.Migrate, inbox.Migrate), applied after these files.

-- The catalogue of SKUs an order may name. The orders service never reads the warehouse's
-- tables: this is its own copy of the catalogue, seeded by 002_products.sql.
CREATE TABLE products (
    sku        text        PRIMARY KEY CHECK (sku <> ''),
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders (
    -- UUIDv7: time-ordered, so new orders land at the right end of the index.
    id          uuid        PRIMARY KEY,
    customer_id text        NOT NULL CHECK (customer_id <> ''),
    status      text        NOT NULL
        CHECK (status IN ('PENDING', 'RESERVED', 'REJECTED', 'CANCELLING', 'CANCELLED')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_customer_id_idx ON orders (customer_id, created_at);

CREATE TABLE order_lines (
    order_id uuid    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    -- The line's position in the request, from 0.
    line_no  integer NOT NULL CHECK (line_no >= 0),
    sku      text    NOT NULL REFERENCES products (sku),
    quantity integer NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    PRIMARY KEY (order_id, line_no),
    UNIQUE (order_id, sku)
);

-- Every status an order went through, with what moved it there.
CREATE TABLE order_status_history (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    -- NULL for the creation.
    from_status text,
    to_status   text        NOT NULL,
    -- OrderCreated and OrderCancelled for the API's actions, the consumed event's type otherwise.
    event       text        NOT NULL,
    -- StockRejected's reason.
    reason      text,
    -- The consumed message that caused the change (NULL for API actions).
    message_id  text,
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX order_status_history_order_id_idx ON order_status_history (order_id, id);

-- The first answer to each POST /orders that carried an Idempotency-Key, written in the same
-- transaction as the order. The primary key is what makes concurrent retries safe: the second
-- INSERT of a key waits for the first transaction and then finds its row.
CREATE TABLE idempotency_keys (
    key             text        PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the canonical request (orders.CreateOrder.Fingerprint).
    request_hash    bytea       NOT NULL,
    -- Set in the same transaction as the INSERT, once the order is written.
    order_id        uuid        REFERENCES orders (id) ON DELETE CASCADE,
    response_status integer,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
