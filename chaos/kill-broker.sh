#!/usr/bin/env bash
# SIGKILL the (private) RabbitMQ node in the middle of the load and start it again.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run broker-kill -v "$@"
