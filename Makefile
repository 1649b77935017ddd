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
	@if [ -t 1 ] && [ -z "$$NO_COLOR" ]; then on='\033[36m' off='\033[0m'; else on= off=; fi; \
		awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %s%-12s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## go vet, then go test -race -count=1 -timeout 30m, in every module and in examples/; pkg/inbox's consumer again with batches; then tools/adoptcheck.sh (the libraries as copies).
	@set -e; for dir in $(MODULES); do \
		echo "==> $${dir#$(CURDIR)/}"; \
		(cd $$dir && go vet ./... && go test -race -count=1 $(GOTEST_FLAGS) ./...); \
	done
	@echo "==> pkg/inbox/inboxrabbitmq with batched inbox transactions (BatchSize 4)"; \
		cd pkg/inbox && OUTBOXSHOP_TEST_INBOX_BATCH=4 go test -race -count=1 $(GOTEST_FLAGS) ./inboxrabbitmq
	@echo "==> examples (outside the workspace)"; cd examples && export GOWORK=off GOFLAGS=-mod=readonly && go vet ./... && go test -race -count=1 $(GOTEST_FLAGS) ./...
	@tools/adoptcheck.sh

.PHONY: lint
lint: ## Fail if any Go file is not gofmt-formatted; go vet every module and examples/.
	@out=$$(gofmt -l $(MODULES) examples); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -e; for dir in $(MODULES); do (cd $$dir && go vet ./...); done
	@cd examples && GOWORK=off GOFLAGS=-mod=readonly go vet ./...

# Ctrl-C reaches make, this shell and both services alike (one process group). The trap stops
# the services and waits for them (a graceful stop takes well under a second), then exits 0,
# so make adds no error of its own. It sends them SIGTERM too, for a signal that reached make
# alone (make passes SIGTERM on to this shell) or came before a service listened for signals.
# It must not signal the whole group (kill 0): that hits make in the middle of its own Ctrl-C
# handling ("make: *** wait: No child processes. Stop.") and returns the prompt before the
# services have stopped. When a service stops by itself, the other is stopped too and its
# status is make's.
.PHONY: run
run: ## Build both services and run each as one process (API + consumer + relay); Ctrl-C stops both.
	@mkdir -p bin
	@go build -o bin/warehouse ./services/warehouse/cmd/warehouse
	@go build -o bin/orders ./services/orders/cmd/orders
	@echo "warehouse on :8090 (admin token: deploy/compose/warehouse-admin-token, development only), orders on :8080 (README.md: Walk the saga); Ctrl-C stops both"
	@stop() { trap '' INT TERM; kill -TERM $$pids 2>/dev/null; s=0; for p in $$pids; do wait $$p || s=$$?; done; return $$s; }; \
		trap 'printf "\nstopping…\n"; stop; exit $$?' INT TERM; \
		WAREHOUSE_LOG_FORMAT=text WAREHOUSE_ADMIN_TOKEN_FILE=deploy/compose/warehouse-admin-token bin/warehouse all & pids=$$!; \
		until curl -sf localhost:8090/readyz >/dev/null; do kill -0 $$pids 2>/dev/null || exit 1; sleep 0.2; done; \
		ORDERS_LOG_FORMAT=text bin/orders all & pids="$$pids $$!"; \
		wait -n; s=$$?; echo "a service stopped; stopping the other…"; stop; exit $$s

.PHONY: observe
observe: ## Prometheus (:9090) and Alertmanager (:9093) for the shop of make run, no Docker (OBSERVE_LAYOUT=roles: one process per role); Ctrl-C stops them.
	@mkdir -p .observe/bin
	@go build -o .observe/bin/observe ./deploy/cmd/observe
	@go build -o .observe/bin/alertlog ./tools/cmd/alertlog
	@exec .observe/bin/observe -layout $(or $(OBSERVE_LAYOUT),all) -dir .observe -alertlog .observe/bin/alertlog

.PHONY: tidy
tidy: ## go mod tidy in every module and in examples/.
	@set -e; for dir in $(MODULES); do (cd $$dir && go mod tidy); done
	@cd examples && GOWORK=off go mod tidy

.PHONY: bench-micro
bench-micro: ## Go micro-benchmarks of pkg/outbox, pkg/inbox and the warehouse's reservation (BENCHTIME=1s by default).
	@set -e; for dir in $(CURDIR)/pkg/outbox $(CURDIR)/pkg/inbox $(CURDIR)/services/warehouse; do \
		(cd $$dir && go test -run '^$$' -bench . -benchtime $${BENCHTIME:-1s} ./...); \
	done

.PHONY: bench
bench: ## Relay throughput and latency vs. the raw limits and Watermill, the WAL relay beside it, inbox consumer vs. the consume limit, one table (~45 min; BENCH_FLAGS=-quick).
	@go run ./bench/cmd/bench $(BENCH_FLAGS)

.PHONY: chaos
chaos: ## Kill, pause, alarm, partition and restart the shop mid-load; prove nothing lost or applied twice (~20 min, partitions as root; CHAOS=poison,…).
	@go run ./chaos/cmd/chaos run $${CHAOS:-all}
