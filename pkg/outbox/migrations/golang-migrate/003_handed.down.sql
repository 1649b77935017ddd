-- Code generated from migrations/templates/003_handed.sql.tmpl by go generate; DO NOT EDIT.

-- Back to version 2: the index goes.
DROP INDEX IF EXISTS "outbox_messages_handed";

-- Migrate's record of version 3 goes too, if Migrate ever ran here: Migrate, run afterwards,
-- applies version 3 again instead of taking its old record for it.
DO $$
BEGIN
    IF to_regclass('"outbox_migrations"') IS NOT NULL THEN
        DELETE FROM "outbox_migrations" WHERE version >= 3;
    END IF;
END;
$$;
