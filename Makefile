# outboxshop — every target runs over every module of the workspace (go.work).
#
# Tests need PostgreSQL and RabbitMQ: set OUTBOXSHOP_TEST_POSTGRES_URL and
# OUTBOXSHOP_TEST_AMQP_URL, or have a Docker engine running (testcontainers starts them).

MODULES := $(shell go list -m -f '{{.Dir}}')
GOTEST_FLAGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## go vet, then go test -race -count=1, in every module.
	@set -e; for dir in $(MODULES); do \
		echo "==> $${dir#$(CURDIR)/}"; \
		(cd $$dir && go vet ./... && go test -race -count=1 $(GOTEST_FLAGS) ./...); \
	done

.PHONY: lint
lint: ## Fail if any Go file is not gofmt-formatted; go vet every module.
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -e; for dir in $(MODULES); do (cd $$dir && go vet ./...); done

.PHONY: tidy
tidy: ## go mod tidy in every module.
	@set -e; for dir in $(MODULES); do (cd $$dir && go mod tidy); done

.PHONY: bench-micro
bench-micro: ## Go micro-benchmarks of pkg/outbox and pkg/inbox (BENCHTIME=1s by default).
	@set -e; for dir in $(CURDIR)/pkg/outbox $(CURDIR)/pkg/inbox; do \
		(cd $$dir && go test -run '^$$' -bench . -benchtime $${BENCHTIME:-1s} ./...); \
	done
