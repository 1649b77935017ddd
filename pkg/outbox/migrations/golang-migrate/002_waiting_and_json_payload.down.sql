-- Code generated from migrations/templates/002_waiting_and_json_payload.sql.tmpl by go generate; DO NOT EDIT.

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
DO $$
BEGIN
    IF to_regclass('"outbox_migrations"') IS NOT NULL THEN
        DELETE FROM "outbox_migrations" WHERE version >= 2;
    END IF;
END;
$$;
