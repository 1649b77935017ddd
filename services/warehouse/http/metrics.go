package http

import "github.com/outboxshop/outboxshop/internal/httpmetrics"

// Metrics are the HTTP metrics of docs/metrics.md, by chi route pattern (internal/httpmetrics).
// Create them once per process and pass them to every router.
type Metrics = httpmetrics.Metrics

// NewMetrics registers the HTTP metrics on reg; constLabels (the service label) go on both.
var NewMetrics = httpmetrics.New

// RouteUnmatched is the route label of a request no route matched.
const RouteUnmatched = httpmetrics.RouteUnmatched
