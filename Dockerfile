# One image recipe for every Go binary of outboxshop: the services, the load generator and the
# compose stack's alert webhook receiver. docker-compose.yml builds it once per binary through
# the build argument PKG, the binary's package path:
#
#   docker build --build-arg PKG=./services/orders/cmd/orders -t outboxshop/orders:dev .
#
# The image holds the binary as /app, its entrypoint, and /healthcheck, a static probe for the
# compose healthchecks (the runtime image has no shell, wget or curl). Without a Docker engine,
# `go test` in deploy/compose parses this file and runs its go build commands for every binary
# that docker-compose.yml builds.

FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
WORKDIR /src

# The workspace and every module's go.mod and go.sum first, so that the download below runs
# again only when a dependency changes. Every module listed in go.work must be copied here:
# the go command refuses a workspace with a module missing (deploy/compose checks the list).
COPY go.work go.work.sum ./
COPY bench/go.mod bench/go.sum bench/
COPY chaos/go.mod chaos/go.sum chaos/
COPY deploy/go.mod deploy/go.sum deploy/
COPY deploy/compose/go.mod deploy/compose/go.sum deploy/compose/
COPY deploy/kubernetes/go.mod deploy/kubernetes/go.sum deploy/kubernetes/
COPY e2e/go.mod e2e/go.sum e2e/
COPY internal/go.mod internal/go.sum internal/
COPY loadgen/go.mod loadgen/go.sum loadgen/
COPY pkg/inbox/go.mod pkg/inbox/go.sum pkg/inbox/
COPY pkg/outbox/go.mod pkg/outbox/go.sum pkg/outbox/
COPY services/orders/go.mod services/orders/go.sum services/orders/
COPY services/warehouse/go.mod services/warehouse/go.sum services/warehouse/
COPY tools/go.mod tools/go.sum tools/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .

# Cross-compiled on the build platform for the target platform: static, no cgo.
ARG TARGETOS TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/healthcheck ./tools/cmd/healthcheck

ARG PKG=./services/orders/cmd/orders
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/app "$PKG"

# Static binaries on distroless: CA certificates, tzdata, /etc/passwd with nonroot (65532), and
# nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/healthcheck /healthcheck
COPY --from=build /out/app /app
USER nonroot:nonroot
ENTRYPOINT ["/app"]
