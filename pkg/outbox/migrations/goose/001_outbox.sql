-- Code generated from migrations/templates/001_outbox.sql.tmpl by go generate; DO NOT EDIT.

-- +goose Up
-- The transactional outbox. Rows are written by outbox.Add inside the business transaction
-- and published by the relay. Every statement is idempotent so the file may be applied again.

CREATE TABLE IF NOT EXISTS "outbox_messages" (
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

-- The relay claimed from this index until version 2: it holds pending rows and nothing else,
-- so the claim costs O(batch) however many published rows the table keeps.
CREATE INDEX IF NOT EXISTS "outbox_messages_pending"
    ON "outbox_messages" (seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- "Is there an older pending row of this aggregate?" — the per-aggregate ordering check.
CREATE INDEX IF NOT EXISTS "outbox_messages_pending_aggregate"
    ON "outbox_messages" (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- Cleanup of old published rows, and the dead-row listing.
CREATE INDEX IF NOT EXISTS "outbox_messages_published"
    ON "outbox_messages" (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_dead"
    ON "outbox_messages" (dead_at)
    WHERE dead_at IS NOT NULL;

-- Wake relays as soon as rows commit. Relays also poll, so a lost notification only costs
-- latency.
--
-- A transaction that has called pg_notify takes a cluster-wide lock at COMMIT and holds it
-- through its WAL flush, so notifying in every writing transaction would let one outbox
-- commit at a time reach the disk, in every database of the cluster: no group commit. So the
-- trigger is deferred to COMMIT, and only the one transaction that gets the advisory lock
-- below notifies; the others commit while it does, without the lock. Their rows are seen by
-- the cycle the notification starts, or by the re-check a relay runs right after a notified
-- cycle (Config.NotifyRecheck), or at worst by the next poll. The advisory lock is
-- re-entrant and notifications of one transaction fold into one: a transaction of many rows
-- notifies once.
--
-- The lock key is derived from the table's names ('outbox_n' as a bigint for the default
-- table): a key no other lock of the library uses.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION "outbox_messages_notify"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_xact_lock(8031453476610924398) THEN
        PERFORM pg_notify('outbox_messages', '');
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS "outbox_messages_notify" ON "outbox_messages";
CREATE CONSTRAINT TRIGGER "outbox_messages_notify"
    AFTER INSERT ON "outbox_messages"
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION "outbox_messages_notify"();

-- +goose Down
-- Drops the outbox, its rows with it. The table's indexes and trigger go with the table.
-- Migrate's version table goes too, if Migrate ever ran here: Migrate, run afterwards, makes
-- the schema again instead of taking its old record for it.
DROP TABLE IF EXISTS "outbox_messages";
DROP FUNCTION IF EXISTS "outbox_messages_notify"();
DROP TABLE IF EXISTS "outbox_migrations";
