-- Code generated from migrations/templates/002_waiting_and_json_payload.sql.tmpl by go generate; DO NOT EDIT.

-- +goose Up
-- Version 2: a claim whose cost does not grow with one aggregate's backlog, and payloads kept
-- byte for byte.
--
-- Applied once, by Migrate under lock_timeout (see migrate.go). ALTER COLUMN … TYPE rewrites
-- the table under an ACCESS EXCLUSIVE lock, and writers wait for the rewrite: on a table that
-- keeps few published rows (run Cleanup) that takes milliseconds; on a large one, apply it in
-- a quiet moment. Every statement is written so that the file may be applied again (by a
-- migration tool that applied it before Migrate recorded versions, say).

-- waiting marks a pending row that cannot be claimed yet because an older row of its
-- aggregate is still pending. Such rows leave the claim index below, so that a claim never
-- walks past an aggregate's backlog. Only a relay sets it (having seen, under a lock, that an
-- older pending row exists); a relay clears it when that older row is published or dies. A
-- new row always starts claimable: a writer can never leave a row stranded.
ALTER TABLE "outbox_messages" ADD COLUMN IF NOT EXISTS waiting boolean NOT NULL DEFAULT false;

-- jsonb re-encodes a payload (key order, white space, duplicate keys) and refuses the \u0000
-- escape; json keeps the text exactly as Add received it, after checking that it is JSON.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT atttypid FROM pg_attribute
        WHERE attrelid = '"outbox_messages"'::regclass AND attname = 'payload') = 'jsonb'::regtype THEN
        ALTER TABLE "outbox_messages" ALTER COLUMN payload TYPE json USING payload::text::json;
    END IF;
END;
$$;
-- +goose StatementEnd

-- The claim walks this index in seq order: the pending rows that may be heads of their
-- aggregate. It replaces the pending index of version 1.
CREATE INDEX IF NOT EXISTS "outbox_messages_claimable"
    ON "outbox_messages" (seq)
    WHERE published_at IS NULL AND dead_at IS NULL AND NOT waiting;
DROP INDEX IF EXISTS "outbox_messages_pending";

-- +goose Down
-- Back to version 1: the pending index instead of the claimable one, jsonb payloads (a
-- payload holding the \u0000 escape, which jsonb refuses, makes this fail), no waiting column.
-- Rewrites the table, as the way up does.
CREATE INDEX IF NOT EXISTS "outbox_messages_pending"
    ON "outbox_messages" (seq)
    WHERE published_at IS NULL AND dead_at IS NULL;
DROP INDEX IF EXISTS "outbox_messages_claimable";
ALTER TABLE "outbox_messages" ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
ALTER TABLE "outbox_messages" DROP COLUMN IF EXISTS waiting;

-- Migrate's record of version 2 goes too, if Migrate ever ran here: Migrate, run afterwards,
-- applies version 2 again instead of taking its old record for it.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('"outbox_migrations"') IS NOT NULL THEN
        DELETE FROM "outbox_migrations" WHERE version >= 2;
    END IF;
END;
$$;
-- +goose StatementEnd
