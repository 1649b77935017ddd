-- The ledger's journal, beside its inbox in schema ledger (inbox.Store makes the schema).
-- Idempotent: applied at every start-up.
--
-- No unique key on payment_id, on purpose: what keeps a payment delivered twice from being
-- booked twice is the inbox, and the example's test proves it. A real journal would add one
-- as a second line of defence.
CREATE TABLE IF NOT EXISTS ledger.entries (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	payment_id   text NOT NULL,
	account      text NOT NULL,
	amount_cents bigint NOT NULL,
	booked_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS entries_account ON ledger.entries (account);
