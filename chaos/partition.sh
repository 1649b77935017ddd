#!/usr/bin/env bash
# Partition the network for real, each server and process in a network namespace of its own:
# a RabbitMQ node cut from its cluster, a relay and a consumer cut from their node, the orders
# primary cut from its standby and its clients, then lossy and slow links.
# Then heal, drain, and prove from both databases that nothing was lost or applied twice.
# Needs root, ip, nft and iptables; runs on private servers; see chaos/README.md. Extra
# arguments go to the engine, e.g. -rate 80 or -keep.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./chaos/cmd/chaos run broker-minority-partition,broker-client-partition,pg-primary-isolated,flaky-network -v "$@"
