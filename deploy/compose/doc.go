// Package compose checks the repository's Docker setup without a Docker engine:
// docker-compose.yml, .env.example, Dockerfile and .dockerignore at the repository root. It has
// no API; `go test` is the whole of it.
//
// # What the tests check
//
// The compose file is loaded with github.com/compose-spec/compose-go/v2, the loader docker
// compose itself uses, with the repository root as project directory and .env.example as the
// env file. Then:
//
//   - the services are exactly those that chaos, Prometheus and Alertmanager name; every build
//     context, Dockerfile and bind-mounted file or folder exists;
//   - every environment variable a service is given is one that its program reads, and every
//     variable it needs is given. For the Go binaries that is read from their source with
//     go/ast (caarlos0/env struct tags with their prefixes, os.Getenv and os.LookupEnv with
//     constant names, and flags whose environment variable a function of the package names);
//     for the images of others it is the documented list in [thirdPartyImages];
//   - every Prometheus scrape and Alertmanager target, every Alertmanager webhook, Grafana's
//     datasource and every healthcheck URL names a compose service and a port that service
//     listens on (from its environment, its program's defaults or the image's documented
//     ports);
//   - Grafana's provisioning folders are mounted and hold the datasource and dashboard
//     provider files, the providers' paths are mounted dashboards, and the home dashboard is
//     one of them with uid outbox-inbox;
//   - the four shop processes export their spans over OTLP/HTTP to the jaeger service
//     (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME), which runs
//     a pinned Jaeger all-in-one with OTLP on and a health probe of its admin port; Prometheus
//     stores exemplars (--enable-feature=exemplar-storage), and Grafana has the Jaeger
//     datasource, to which the Prometheus datasource links an exemplar's trace_id;
//   - every service has a healthcheck (but the one-shots, which restart on failure alone), a
//     restart policy and an image with a version tag;
//     depends_on waits for service_healthy, orders the shop as the queues require and has no
//     cycle; no two services publish the same host port;
//   - the credentials come from the environment with the defaults of .env.example, and the
//     database and broker URLs are built from them;
//   - the profile cluster (`docker compose --profile cluster up`) adds exactly rabbitmq-2 and
//     rabbitmq-3: the image of rabbitmq, one Erlang cookie from .env, a data volume each, a
//     classic peer discovery configuration naming the three nodes with rabbit@rabbitmq first,
//     a healthcheck that passes once three nodes run in the cluster; every shop process is
//     given all three nodes' AMQP URLs and waits for each to be healthy, the two profiled ones
//     with required: false so that the stack still starts without the profile;
//   - TLS: the one-shot tls-certs runs the committed deploy/compose/tls-certs.sh in the nodes'
//     image, and whatever mounts its volumes (read-only) waits for it to complete; the shop
//     processes dial amqps:// on 5671 to every node and postgres with sslmode=verify-full,
//     trusting one CA from those volumes; every node listens on 5671 with the generated files
//     (rabbitmq-2 and rabbitmq-3 on nothing else) and postgres runs with ssl=on; with openssl on
//     the machine the script is run and what it issues verified (host names, key pairs, modes,
//     owners, no key where the shop reads); no private key is among the repository's files.
//
// The Dockerfile is parsed and linted with BuildKit's own parser and linter (what `docker build
// --check` runs), its base images are pinned and its runtime stage runs as non-root; its COPY
// instructions are replayed on the build context that .dockerignore leaves, and its go build
// commands are run there, with CGO_ENABLED=0 and GOOS=linux, for every binary the compose file
// builds. The result must be a static binary.
//
// What needs an engine is not checked: that the images pull and start, that the healthchecks
// pass, that the services reach each other.
package compose
