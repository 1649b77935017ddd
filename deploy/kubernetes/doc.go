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
// (CloudNativePG), the PodMonitor, ServiceMonitor and PrometheusRule (Prometheus Operator),
// the ScaledObject (KEDA) and the Issuer and Certificate (cert-manager). A kind none of them
// knows fails. Then:
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
//   - every Secret, ConfigMap and host a container names exists in the build, is one the
//     operators make for the objects of the build (shop-db-app, shop-db-ca, shop-db-rw,
//     shop-mq-default-user, shop-mq-tls, shop-mq-server-N.shop-mq-nodes) or one
//     kustomization.yaml tells the person deploying to create (warehouse-admin,
//     orders-connection, warehouse-connection), every $(VAR) in its environment is a
//     variable defined before it, and every ORDERS_… or WAREHOUSE_… variable it is given (or a
//     ConfigMap holds) is a setting the service declares in its Go source, or its _FILE form;
//   - no container is given a Secret through its environment: every shop process reads its
//     database URL, its broker URL (the migrations have none) and the CAs of the servers
//     from files of read-only Secret volumes, through <SERVICE>_…_FILE, readable by the pod's
//     fsGroup only; of the broker's certificate Secret a shop pod mounts ca.crt alone;
//   - TLS everywhere: the RabbitmqCluster has spec.tls with its plain listeners disabled and
//     a cert-manager Certificate that names every node the URLs use; the database refuses TCP
//     without TLS; the commands that create the URLs' Secrets (kustomization.yaml, the same
//     in docs/production.md) build amqps:// URLs to every node on 5671 and postgres:// ones
//     to shop-db-rw with sslmode=verify-full;
//   - the NetworkPolicies, evaluated for every pair of pods (the shop's, the operators'
//     instances, Prometheus, the operators, an ingress controller, kube-dns, the Kubernetes
//     API) on every port of the destination, allow exactly the connections
//     network/policies.yaml lists, and no shop process reaches another's pods;
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
