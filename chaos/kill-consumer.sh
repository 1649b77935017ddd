#!/usr/bin/env bash
# Kill the warehouse consumer before and after its commit, and in the middle of a batch,
# while orders flow.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run consumer-before-commit,consumer-after-commit,consumer-mid-batch -v "$@"
