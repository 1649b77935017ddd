package service

import (
	"context"
	"net"

	"github.com/outboxshop/outboxshop/internal/envconfig"
	"github.com/outboxshop/outboxshop/internal/httpapi"
)

// HTTPAddrs are the addresses a process's HTTP listeners bind ([ListenHTTP]): a service's
// <SERVICE>_HTTP_ADDR, <SERVICE>_OPS_ADDR and <SERVICE>_RELAY_HTTP_ADDR.
type HTTPAddrs struct {
	// API is where an api or all process serves the API.
	API string
	// Ops is where an api or all process serves /healthz, /readyz and /metrics on a
	// listener of their own; empty: the API's listener serves them.
	Ops string
	// Relay is where a relay process serves /healthz, /readyz and /metrics.
	Relay string
}

// Listeners are a process's HTTP listeners. Both services' apps build their routers from
// them: the API's router on API, with the operations routes of [Listeners.APIOps], and a
// router of the operations routes alone on Ops.
type Listeners struct {
	// API serves the API; nil in a process that serves none (the relay).
	API net.Listener
	// Ops serves /healthz, /readyz and /metrics alone: the relay's, or an api or all
	// process's when <SERVICE>_OPS_ADDR is set; nil when the API's listener serves them.
	Ops net.Listener
}

// ListenHTTP binds the listeners of a process that serves the API (api: the api and all
// modes) or not (the relay), and registers their closing with p's group ([Listen]). An API
// process listens on addrs.API, and on addrs.Ops too when it is set; a relay process listens
// on addrs.Relay, as its Ops. When it fails, the listeners it bound are closed with p's group.
func ListenHTTP(ctx context.Context, p *Process, api bool, addrs HTTPAddrs) (Listeners, error) {
	var ls Listeners
	var err error
	if !api {
		ls.Ops, err = Listen(ctx, p, addrs.Relay)
		return ls, err
	}
	if ls.API, err = Listen(ctx, p, addrs.API); err != nil {
		return Listeners{}, err
	}
	if addrs.Ops != "" {
		if ls.Ops, err = Listen(ctx, p, addrs.Ops); err != nil {
			return Listeners{}, err
		}
	}
	return ls, nil
}

// APIOps are the operations routes of the API's router: all of them (httpapi.AllOps) while
// the process has no operations listener, else /healthz and /readyz only
// (httpapi.ProbesOnly): /metrics is then served on Ops alone and answers 404 on the API's
// port, while a health check of the API's port (a load balancer's, compose's) keeps working.
func (l Listeners) APIOps() httpapi.OpsRoutes {
	if l.Ops != nil {
		return httpapi.ProbesOnly
	}
	return httpapi.AllOps
}

// APIAddr is the API's address ("127.0.0.1:43127"), or "" when the process serves none.
func (l Listeners) APIAddr() string { return Addr(l.API) }

// OpsAddr is the address of the operations listener, or "" when the API's serves the
// operations routes.
func (l Listeners) OpsAddr() string { return Addr(l.Ops) }

// CheckOpsAddr records in v an operations address (<prefix>OPS_ADDR) that cannot work beside
// the API's (<prefix>HTTP_ADDR): one that is not host:port, or one on the API's port (the
// same address, or the same port where either listens on every interface), which the second
// listener could not bind. Port 0 (a free port, in tests) never clashes. Empty opsAddr is
// the default: the API's listener serves the operations routes.
func CheckOpsAddr(v *envconfig.Checks, prefix, httpAddr, opsAddr string) {
	if opsAddr == "" {
		return
	}
	opsHost, opsPort, err := net.SplitHostPort(opsAddr)
	if err != nil {
		v.Check(false, "%sOPS_ADDR must be host:port or :port, is %q", prefix, opsAddr)
		return
	}
	clash := opsAddr == httpAddr
	if apiHost, apiPort, err := net.SplitHostPort(httpAddr); err == nil {
		clash = opsPort == apiPort && (opsHost == apiHost || anyHost(opsHost) || anyHost(apiHost))
	}
	v.Check(!clash || opsPort == "0", "%sOPS_ADDR (%s) must differ from %sHTTP_ADDR (%s): the operations routes get a port of their own, or leave %sOPS_ADDR empty to serve them on the API's",
		prefix, opsAddr, prefix, httpAddr, prefix)
}

// anyHost reports whether host, of a listen address, means every interface.
func anyHost(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}
