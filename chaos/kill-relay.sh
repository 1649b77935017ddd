#!/usr/bin/env bash
# Kill the orders relay at each of its three crash points (before publishing, after the
# broker's confirm, after marking the rows) while orders flow.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run relay-before-publish,relay-after-publish,relay-after-mark -v "$@"
