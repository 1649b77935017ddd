// Package observe runs Prometheus and Alertmanager for the shop on this machine, without
// Docker: it is `make observe` (docs/observe.md).
//
// # The configuration
//
// [Generate] derives a configuration from the compose one, deploy/prometheus/prometheus.yml
// and deploy/alertmanager/alertmanager.yml: the same jobs, rules, routes and receivers, with
// every compose address (orders-api:8080, alertmanager:9093, alert-logger:8080…) rewritten to
// the 127.0.0.1 address of [Addresses], the one table of the local ports. The rules are
// copied next to it unchanged. Tests that run the shop themselves (e2e's TestObservability)
// pass a table of their own processes' addresses, a shorter interval, and [Options].MaxFor,
// which cuts the alerts' for: to seconds.
//
// The job label is the process role (docs/metrics.md), and the rules rely on it: the relay
// jobs end in -relay, the API jobs hold the outbox backlog. Under `make run` ([LayoutAll])
// there is no relay process: `orders all` and `warehouse all` serve the metrics of every role
// on their API port. That port is then scraped twice, as the API job without the relay's
// metrics and as the relay job with only the relay's metrics (those that pkg/outbox/outboxmetrics
// and pkg/outbox/outboxrabbitmq/outboxrabbitmqmetrics register), so that every series has the job of the
// role that makes it, once, and the relay job is up exactly when its process is. With one
// process per role ([LayoutRoles], docs/local.md) each job has its own port, as in compose.
//
// # The servers
//
// [Run] writes the configuration, starts Prometheus, Alertmanager (the Debian packages, or
// the release binaries on the PATH) and the alert logger of tools/cmd/alertlog, prints the
// URLs to open, and stops them when its context ends. Their data and logs stay in the scratch
// folder (.observe/) from one run to the next.
package observe
