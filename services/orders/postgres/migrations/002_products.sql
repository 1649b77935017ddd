-- The catalogue: the same SKUs as the warehouse's.
INSERT INTO products (sku, name) VALUES
    ('BOOK-1', 'The Go Programming Language'),
    ('MUG-1', 'Outbox mug'),
    ('TEE-1', 'Inbox T-shirt'),
    ('PEN-1', 'Idempotent pen'),
    ('BAG-1', 'Saga tote bag')
ON CONFLICT (sku) DO NOTHING;
