#!/usr/bin/env bash
# Publish malformed OrderCreated events straight to the events exchange, and write bad rows
# straight into the orders outbox. Then heal, drain, and prove from both databases that nothing
# was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run poison,outbox-poison -v "$@"
