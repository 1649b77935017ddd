// Package kubernetes checks the shop's Kubernetes manifests (this folder, applied with
// `kubectl apply -k deploy/kubernetes`) without a cluster. It has no API; `go test` is the
// whole of it.
//
// # What the tests check
//
// The kustomization is built with kustomize's own Go API (sigs.k8s.io/kustomize/api/krusty),
// as `kubectl apply -k` builds it. Every object it yields is decoded strictly, unknown fields
// failing, into its typed API: k8s.io/api for the built-in kinds, and the operators' own API
// packages for the RabbitmqCluster (RabbitMQ Cluster Operator), the Cluster and Database
// (CloudNativePG), the PodMonitor, ServiceMonitor and PrometheusRule (Prometheus Operator)
// and the ScaledObject (KEDA). A kind none of them knows fails. Then:
//
//   - every Deployment runs at least two replicas whose selector selects its own pods, has a
//     startup, a liveness (/healthz) and a readiness (/readyz) probe on a port it declares,
//     CPU and memory requests and a memory limit, a PodDisruptionBudget, and a termination
//     grace period longer than the graceful stop it may take (for a relay: a claimed batch,
//     RELAY_CLAIM_TIMEOUT; for an API: its preStop pause and its shutdown timeouts), the
//     timeouts read from the settings' defaults in the Go source or the Deployment's own
//     environment;
//   - every Service, PodDisruptionBudget, PodMonitor and ServiceMonitor selects pods (or the
//     operators' Services) that exist and have the ports it names; the pods the operators
//     make are modelled from their documented names and labels;
//   - every Secret, ConfigMap and host a container names exists in the build or is one the
//     operators make for the objects of the build (shop-db-app, shop-db-rw,
//     shop-mq-default-user, shop-mq-server-N.shop-mq-nodes), every $(VAR) in its
//     environment is a variable defined before it, and every ORDERS_… or WAREHOUSE_… variable
//     it is given (or a ConfigMap holds) is a setting the service declares in its Go source;
//   - the warehouse API, and no other Deployment, reads its admin token from the Secret
//     warehouse-admin (key token, which the person deploying creates: kustomization.yaml)
//     mounted read-only as a file, through WAREHOUSE_ADMIN_TOKEN_FILE; no manifest holds a
//     token;
//   - every image is pinned to a version; the broker has three replicas and the database
//     three instances with synchronous replication;
//   - the PrometheusRule holds exactly the groups of deploy/prometheus/rules (the rules the
//     compose stack's Prometheus loads and promtool tests): `go test -run TestPrometheusRule
//     -update` writes it from them;
//   - each relay's ScaledObject scales a Deployment of the build on
//     outbox_oldest_pending_age_seconds (docs/metrics.md) of a job the PodMonitor scrapes.
//
// What needs a cluster is not checked: the operators' admission webhooks, the images pulling,
// the pods starting.
package kubernetes
