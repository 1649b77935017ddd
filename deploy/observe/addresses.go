package observe

import (
	"fmt"
	"strings"
)

// Layout is how the shop's processes run on this machine.
type Layout string

const (
	// LayoutAll is `make run`: each service is one process (`orders all`, `warehouse all`)
	// that serves the metrics of all its roles on its API port.
	LayoutAll Layout = "all"
	// LayoutRoles is one process per role, each with its own port, as compose runs them
	// (docs/local.md, "One process per role").
	LayoutRoles Layout = "roles"
)

// ParseLayout returns the layout named s.
func ParseLayout(s string) (Layout, error) {
	switch l := Layout(s); l {
	case LayoutAll, LayoutRoles:
		return l, nil
	}
	return "", fmt.Errorf("unknown layout %q: want %s (make run) or %s (one process per role)", s, LayoutAll, LayoutRoles)
}

// Address is where one address of the compose configuration is on this machine.
type Address struct {
	// Compose is the host:port as the compose configuration writes it.
	Compose string
	// All is the local address under LayoutAll, Roles under LayoutRoles.
	All, Roles string
	// Relay marks an outbox relay's /metrics. Under LayoutAll its address is that of its
	// service's API process, which is then scraped twice (see the package doc).
	Relay bool
}

// Local is the address under layout.
func (a Address) Local(layout Layout) string {
	if layout == LayoutRoles {
		return a.Roles
	}
	return a.All
}

// Addresses is the one table of the local ports: every address that the compose
// configuration of Prometheus and Alertmanager names, and where the servers of `make observe`
// listen. The services' ports are their defaults (HTTPAddr, RelayHTTPAddr of
// services/*/app/config.go), which `make run` does not change; the tests check both.
var Addresses = []Address{
	{Compose: "orders-api:8080", All: "127.0.0.1:8080", Roles: "127.0.0.1:8080"},
	{Compose: "orders-relay:8081", All: "127.0.0.1:8080", Roles: "127.0.0.1:8081", Relay: true},
	{Compose: "warehouse:8090", All: "127.0.0.1:8090", Roles: "127.0.0.1:8090"},
	{Compose: "warehouse-relay:8091", All: "127.0.0.1:8090", Roles: "127.0.0.1:8091", Relay: true},
	// RabbitMQ's rabbitmq_prometheus plugin.
	{Compose: "rabbitmq:15692", All: "127.0.0.1:15692", Roles: "127.0.0.1:15692"},
	// The servers that Run starts. The alert logger listens on 8080 in compose, which is the
	// orders API here.
	{Compose: "prometheus:9090", All: "127.0.0.1:9090", Roles: "127.0.0.1:9090"},
	{Compose: "alertmanager:9093", All: "127.0.0.1:9093", Roles: "127.0.0.1:9093"},
	{Compose: "alert-logger:8080", All: "127.0.0.1:9095", Roles: "127.0.0.1:9095"},
}

// The compose addresses of the servers that Run starts.
const (
	composePrometheus   = "prometheus:9090"
	composeAlertmanager = "alertmanager:9093"
	composeAlertLogger  = "alert-logger:8080"
)

// table is a lookup of Addresses (or a test's replacement) under one layout.
type table struct {
	layout Layout
	rows   map[string]Address
}

func newTable(layout Layout, addrs []Address) table {
	t := table{layout: layout, rows: make(map[string]Address, len(addrs))}
	for _, a := range addrs {
		t.rows[a.Compose] = a
	}
	return t
}

// row is the row of a compose address. An address missing from the table is an error, so
// that a job added to the compose configuration is not silently scraped at a host name that
// does not resolve here.
func (t table) row(compose string) (Address, error) {
	a, ok := t.rows[compose]
	if !ok {
		return Address{}, fmt.Errorf("%s is not in the table of local addresses (deploy/observe Addresses): add it there", compose)
	}
	return a, nil
}

// local is the local address of one of the table's own compose addresses.
func (t table) local(compose string) string {
	a, ok := t.rows[compose]
	if !ok {
		panic("observe: " + compose + " missing from the table")
	}
	return a.Local(t.layout)
}

// sharedWithRelay reports whether the local address serves the metrics of a relay and of another
// role (LayoutAll): the jobs scraping it then split its metrics between them.
func (t table) sharedWithRelay(local string) bool {
	relays, others := 0, 0
	for _, a := range t.rows {
		if a.Local(t.layout) != local {
			continue
		}
		if a.Relay {
			relays++
		} else {
			others++
		}
	}
	return relays > 0 && others > 0
}

// browserURL is the http URL of a local address, written with localhost: what a browser opens.
func browserURL(local string) string {
	return "http://" + strings.Replace(local, "127.0.0.1", "localhost", 1)
}
