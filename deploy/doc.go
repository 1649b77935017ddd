// Package deploy is the monitoring configuration of outboxshop, and the tests that keep it
// honest. It has no code of its own; the files next to it are:
//
//   - prometheus/prometheus.yml: the scrape configuration (one job per process, RabbitMQ's
//     aggregated and per-queue endpoints);
//   - prometheus/rules: recording and alerting rules; prometheus/tests: their promtool unit
//     tests; prometheus/testdata/rabbitmq_metrics.txt: what the RabbitMQ plugin exports;
//   - alertmanager/alertmanager.yml: routing by severity (page, ticket, info);
//   - grafana/provisioning and grafana/dashboards: the datasource, the dashboard provider and
//     the dashboards.
//
// # Checks
//
// go test runs, without any server:
//
//   - every PromQL expression of the rules and the dashboards parses (Grafana variables
//     replaced by sample values) and names only metrics that exist: recording rules, the
//     metrics registered by pkg/outbox/outboxmetrics, pkg/inbox/inboxmetrics and their adapters'
//     outboxrabbitmqmetrics and inboxrabbitmqmetrics, the service metrics of the contract in docs/metrics.md,
//     the RabbitMQ plugin's metrics, the Go and process collectors', and Prometheus' own up
//     and ALERTS;
//   - every alert has a for duration, a severity (page, ticket or info), a summary, a
//     description and a runbook_url whose anchor is a heading of docs/runbook.md, and a
//     promtool unit test that shows it firing and not firing;
//   - the dashboards follow the conventions: stable uid, no id, one datasource variable used
//     by every panel and query, $__rate_interval in every rate() and increase(), firing
//     alerts shown;
//   - promtool check config, promtool check rules, promtool test rules and amtool
//     check-config pass. These need promtool and amtool on the PATH (Debian: apt-get install
//     prometheus prometheus-alertmanager); without them the tests skip, unless CI=true.
package deploy
