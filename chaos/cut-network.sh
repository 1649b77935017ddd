#!/usr/bin/env bash
# Cut the network between the services and RabbitMQ, then slow it down.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run network -v "$@"
