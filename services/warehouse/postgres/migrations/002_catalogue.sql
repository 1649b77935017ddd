-- The catalogue a fresh warehouse sells, with a 'restock' ledger row for each SKU this
-- inserts. SKUs that exist already are left alone (ON CONFLICT DO NOTHING).
-- Keep in step with warehouse.Catalogue (warehouse.go); a test checks that they agree.
WITH inserted AS (
    INSERT INTO stock (sku, name, available)
    VALUES ('BOOK-1', 'The Go Programming Language', 100),
           ('MUG-1', 'Outbox mug', 50),
           ('TEE-1', 'Inbox T-shirt', 30),
           ('PEN-1', 'Idempotent pen', 200),
           ('BAG-1', 'Saga tote bag', 10)
    ON CONFLICT (sku) DO NOTHING
    RETURNING sku, available
)
INSERT INTO stock_movements (sku, delta, kind)
SELECT sku, available, 'restock' FROM inserted;
