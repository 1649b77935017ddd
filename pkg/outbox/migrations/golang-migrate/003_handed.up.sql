-- Code generated from migrations/templates/003_handed.sql.tmpl by go generate; DO NOT EDIT.

-- Version 3: the pending rows that carry a last_error, in seq order. They are the rows a
-- failed publish left to be retried and, with a WAL relay, every row its stream handed to
-- its retry lane: that lane claims from this index, and the relay reads its held aggregates
-- from it, in time that follows these rows alone, whatever the backlog the stream is
-- publishing. Few rows are ever in it, so it costs the writers nothing.
--
-- Applied once, by Migrate under lock_timeout (see migrate.go). CREATE INDEX holds off
-- writers while it reads the pending rows (milliseconds on a table that keeps few); the
-- statement may be applied again.
CREATE INDEX IF NOT EXISTS "outbox_messages_handed"
    ON "outbox_messages" (seq)
    WHERE published_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL;
