-- The transactional outbox. Rows are written by outbox.Add inside the business transaction
-- and published by the relay. Every statement is idempotent so the file may be applied again.

CREATE TABLE IF NOT EXISTS outbox_messages (
    -- The message id for ever: it becomes the AMQP message-id the inbox deduplicates on.
    id              uuid        PRIMARY KEY,
    -- Write order. Only used to order rows of one aggregate and to claim oldest first.
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    type            text        NOT NULL,
    -- The ordering key: rows of one aggregate are published in seq order.
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    payload         jsonb       NOT NULL,
    -- correlation_id, causation_id, traceparent and any other string header.
    headers         jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    -- NULL while pending.
    published_at    timestamptz,
    -- Set when the row gave up (MaxAttempts, or a permanent error); NULL otherwise.
    dead_at         timestamptz
);

-- The relay claims from this index only: it holds pending rows and nothing else, so the
-- claim costs O(batch) however many published rows the table keeps.
CREATE INDEX IF NOT EXISTS outbox_messages_pending
    ON outbox_messages (seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- "Is there an older pending row of this aggregate?" — the per-aggregate ordering check.
CREATE INDEX IF NOT EXISTS outbox_messages_pending_aggregate
    ON outbox_messages (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- Cleanup of old published rows, and the dead-row listing.
CREATE INDEX IF NOT EXISTS outbox_messages_published
    ON outbox_messages (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_messages_dead
    ON outbox_messages (dead_at)
    WHERE dead_at IS NOT NULL;

-- Wake relays as soon as rows commit (NOTIFY is delivered at commit, and several
-- notifications of one transaction fold into one). Relays also poll, so a lost
-- notification only costs latency.
CREATE OR REPLACE FUNCTION outbox_messages_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_messages', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_messages_notify ON outbox_messages;
CREATE TRIGGER outbox_messages_notify
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_messages_notify();
