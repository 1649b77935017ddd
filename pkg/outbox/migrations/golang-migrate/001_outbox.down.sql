-- Code generated from migrations/templates/001_outbox.sql.tmpl by go generate; DO NOT EDIT.

-- Drops the outbox, its rows with it. The table's indexes and trigger go with the table.
DROP TABLE IF EXISTS "outbox_messages";
DROP FUNCTION IF EXISTS "outbox_messages_notify"();
