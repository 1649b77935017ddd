#!/usr/bin/env bash
# SIGKILL the orders PostgreSQL in the middle of the load and start it again; then SIGKILL
# the primary of an orders PostgreSQL with a synchronous standby and promote the standby; then
# take that standby away, crash-restart the primary twice, kill it and promote the standby.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run orders-db-kill,pg-failover,pg-flap-failover -v "$@"
