-- The payments service's own table, beside its outbox in schema payments (outbox.Store
-- makes the schema). Idempotent: applied at every start-up.
CREATE TABLE IF NOT EXISTS payments.payments (
	id           text PRIMARY KEY,
	account      text NOT NULL,
	amount_cents bigint NOT NULL CHECK (amount_cents > 0),
	captured_at  timestamptz NOT NULL DEFAULT now()
);
