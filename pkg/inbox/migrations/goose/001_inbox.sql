-- Code generated from migrations/templates/001_inbox.sql.tmpl by go generate; DO NOT EDIT.

-- +goose Up
-- The inbox table records every message a consumer has processed, so that a redelivery of the
-- same message is recognised and skipped. Rows are written by inbox.Process in the same
-- transaction as the consumer's own changes, and deleted by inbox.Cleanup after the retention.
-- Every statement is idempotent so the file may be applied again.

CREATE TABLE IF NOT EXISTS "inbox_messages" (
    -- Name of the handler that processed the message. Several handlers in one database each
    -- process the same message once, because the name is part of the key.
    consumer     text        NOT NULL,
    -- Id given by the producer (the AMQP message-id); stable across redeliveries and retries.
    message_id   text        NOT NULL,
    message_type text        NOT NULL,
    -- When the consumer received the message.
    received_at  timestamptz NOT NULL,
    -- When the processing transaction started; Cleanup deletes by this column.
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id),
    CONSTRAINT "inbox_messages_consumer_not_empty" CHECK (consumer <> ''),
    CONSTRAINT "inbox_messages_message_id_not_empty" CHECK (message_id <> '')
);

-- Cleanup deletes the oldest rows in batches through this index.
CREATE INDEX IF NOT EXISTS "inbox_messages_processed_at_idx" ON "inbox_messages" (processed_at);

COMMENT ON TABLE "inbox_messages" IS
    'Messages processed per consumer, for deduplication (outboxshop inbox). Keep rows longer than the longest redelivery window.';

-- +goose Down
-- Drops the inbox, its rows with it: redeliveries of messages processed before are then
-- processed again.
DROP TABLE IF EXISTS "inbox_messages";
-- Migrate's version table goes too, if Migrate ever ran here: Migrate, run afterwards, makes
-- the schema again instead of taking its old record for it.
DROP TABLE IF EXISTS "inbox_migrations";
