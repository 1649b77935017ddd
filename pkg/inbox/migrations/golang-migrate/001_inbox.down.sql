-- Code generated from migrations/templates/001_inbox.sql.tmpl by go generate; DO NOT EDIT.

-- Drops the inbox, its rows with it: redeliveries of messages processed before are then
-- processed again.
DROP TABLE IF EXISTS "inbox_messages";
-- Migrate's version table goes too, if Migrate ever ran here: Migrate, run afterwards, makes
-- the schema again instead of taking its old record for it.
DROP TABLE IF EXISTS "inbox_migrations";
