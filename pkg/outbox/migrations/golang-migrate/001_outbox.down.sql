-- Code generated from migrations/templates/001_outbox.sql.tmpl by go generate; DO NOT EDIT.

-- Drops the outbox, its rows with it. The table's indexes and trigger go with the table.
-- Migrate's version table goes too, if Migrate ever ran here: Migrate, run afterwards, makes
-- the schema again instead of taking its old record for it.
DROP TABLE IF EXISTS "outbox_messages";
DROP FUNCTION IF EXISTS "outbox_messages_notify"();
DROP TABLE IF EXISTS "outbox_migrations";
