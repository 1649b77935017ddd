module github.com/outboxshop/outboxshop/tools

go 1.26.8

require (
	github.com/caarlos0/env/v11 v11.4.2
	github.com/golang-migrate/migrate/v4 v4.20.1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/outboxshop/outboxshop/pkg/inbox v0.0.0-00010101000000-000000000000
	github.com/outboxshop/outboxshop/pkg/outbox v0.0.0-00010101000000-000000000000
	github.com/pressly/goose/v3 v3.30.1
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgerrcode v0.0.0-20220416144525-469b46aa5efa // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mfridman/interpolate v0.2.0 // indirect
	github.com/sethvargo/go-retry v0.5.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

replace (
	github.com/outboxshop/outboxshop/pkg/inbox => ../pkg/inbox
	github.com/outboxshop/outboxshop/pkg/outbox => ../pkg/outbox
)
