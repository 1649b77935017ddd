-- Code generated from migrations/templates/001_inbox.sql.tmpl by go generate; DO NOT EDIT.

-- Drops the inbox, its rows with it: redeliveries of messages processed before are then
-- processed again.
DROP TABLE IF EXISTS "inbox_messages";
