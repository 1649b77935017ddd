#!/usr/bin/env bash
# Do to the shop what operations do: deploy every process again while orders flow, raise the
# broker's memory alarm, freeze one of two relays for 30s, keep the warehouse's database away
# for longer than the queues' delivery limit. Then heal, drain, and prove from both databases
# that nothing was lost or applied twice.
# Runs on private PostgreSQL and RabbitMQ servers; see chaos/README.md. Extra arguments go to
# the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run migrate-under-load,broker-alarm,relay-paused,db-outage-long -v "$@"
