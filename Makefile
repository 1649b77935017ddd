# outboxshop — every target runs over every module of the workspace (go.work).
#
# Tests need PostgreSQL and RabbitMQ: set OUTBOXSHOP_TEST_POSTGRES_URL and
# OUTBOXSHOP_TEST_AMQP_URL, or have a Docker engine running (testcontainers starts them).

SHELL := bash
MODULES := $(shell go list -m -f '{{.Dir}}')
GOTEST_FLAGS ?= -timeout 30m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## go vet, then go test -race -count=1 -timeout 30m, in every module; then tools/adoptcheck.sh (the libraries as copies).
	@set -e; for dir in $(MODULES); do \
		echo "==> $${dir#$(CURDIR)/}"; \
		(cd $$dir && go vet ./... && go test -race -count=1 $(GOTEST_FLAGS) ./...); \
	done
	@tools/adoptcheck.sh

.PHONY: lint
lint: ## Fail if any Go file is not gofmt-formatted; go vet every module.
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -e; for dir in $(MODULES); do (cd $$dir && go vet ./...); done

.PHONY: run
run: ## Build both services and run each as one process (API + consumer + relay); Ctrl-C stops both.
	@mkdir -p bin
	@go build -o bin/warehouse ./services/warehouse/cmd/warehouse
	@go build -o bin/orders ./services/orders/cmd/orders
	@echo "warehouse on :8090, orders on :8080 — see README.md for a walk through the saga"
	@trap 'kill 0 2>/dev/null' EXIT; \
		WAREHOUSE_LOG_FORMAT=text bin/warehouse all & w=$$!; \
		until curl -sf localhost:8090/readyz >/dev/null; do kill -0 $$w 2>/dev/null || exit 1; sleep 0.2; done; \
		ORDERS_LOG_FORMAT=text bin/orders all & \
		wait -n

.PHONY: tidy
tidy: ## go mod tidy in every module.
	@set -e; for dir in $(MODULES); do (cd $$dir && go mod tidy); done

.PHONY: bench-micro
bench-micro: ## Go micro-benchmarks of pkg/outbox, pkg/inbox and the warehouse's reservation (BENCHTIME=1s by default).
	@set -e; for dir in $(CURDIR)/pkg/outbox $(CURDIR)/pkg/inbox $(CURDIR)/services/warehouse; do \
		(cd $$dir && go test -run '^$$' -bench . -benchtime $${BENCHTIME:-1s} ./...); \
	done

.PHONY: bench
bench: ## Relay throughput and latency vs. the raw limits and Watermill, one table (~10 min; BENCH_FLAGS=-quick).
	@go run ./bench/cmd/bench $(BENCH_FLAGS)

.PHONY: chaos
chaos: ## Kill, pause, alarm and restart the shop mid-load; prove nothing lost or applied twice (~10 min; CHAOS=poison,…).
	@go run ./chaos/cmd/chaos run $${CHAOS:-all}
