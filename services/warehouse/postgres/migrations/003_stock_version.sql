-- stock.version grows with every change of a row, whoever makes it (a reservation, a release,
-- a write of the API, the seed): the HTTP API's ETag, so that PUT /stock/{sku} with If-Match
-- refuses to overwrite a change made since the caller read the row. A trigger rather than
-- each UPDATE: no statement can forget it.
ALTER TABLE stock ADD COLUMN version bigint NOT NULL DEFAULT 1;

CREATE FUNCTION stock_next_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;

CREATE TRIGGER stock_version BEFORE UPDATE ON stock FOR EACH ROW EXECUTE FUNCTION stock_next_version();
