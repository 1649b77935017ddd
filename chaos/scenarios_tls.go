package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// ---- tls ----
//
// The shop on servers of its own that take TLS alone: every process connects with amqps://
// and sslmode=verify-full, the CA and a client certificate given by its settings, and so do
// the runner's clients (the verifier, the observer, the queue inspections). Two crash points
// kill a relay and a consumer mid-load, so that the restarted processes must connect over TLS
// again, and the duplicates they make must be absorbed as on a shop without it.

func init() {
	register(Scenario{
		Name: "tls",
		Summary: "the shop on PostgreSQL and RabbitMQ that take TLS alone, client certificates required: the orders relay killed after a confirm " +
			"and the warehouse consumer after a commit, both restarted over TLS; the duplicates absorbed",
		TLS: true,
		Failpoints: func(rate float64) map[Service]string {
			return map[Service]string{
				OrdersRelay: fmt.Sprintf("%s=kill@%d", pointRelayAfterPublish, hits(rate, 0.75)),
				Warehouse:   fmt.Sprintf("%s=kill@%d", pointConsumerAfterCommit, hits(rate, 1.5)),
			}
		},
		Inject: injectTLSCrashes,
		Check:  checks(expectDuplicates(true), checkTLSSessions, checkTLSRefusals),
	})
}

// injectTLSCrashes waits for both crash points and heals both processes.
func injectTLSCrashes(ctx context.Context, e *Env) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = crashedAndHealed(ctx, e, OrdersRelay, pointRelayAfterPublish, "") })
	wg.Go(func() { errs[1] = crashedAndHealed(ctx, e, Warehouse, pointConsumerAfterCommit, "") })
	wg.Wait()
	return errors.Join(errs...)
}

// checkTLSSessions requires every process of the shop to have a session on its database at
// the end (the restarted ones too), each over TLS with the client certificate.
func checkTLSSessions(ctx context.Context, e *Env, o *Outcome) {
	for _, db := range []struct {
		url   string
		procs []Service
	}{
		{e.Endpoints.OrdersDB, []Service{OrdersAPI, OrdersRelay}},
		{e.Endpoints.WarehouseDB, []Service{Warehouse, WarehouseRelay}},
	} {
		conn, err := openDB(ctx, db.url)
		if err != nil {
			o.Failures = append(o.Failures, fmt.Sprintf("connect over TLS: %v", err))
			continue
		}
		rows, err := conn.Query(ctx, `
			SELECT a.application_name, coalesce(s.ssl, false), coalesce(s.client_dn, '')
			FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s USING (pid)
			WHERE a.datname = current_database() AND a.backend_type = 'client backend'`)
		seen := map[string]int{}
		var plain []string
		for err == nil && rows.Next() {
			var app, dn string
			var ssl bool
			if err = rows.Scan(&app, &ssl, &dn); err != nil {
				break
			}
			seen[cmp.Or(app, "the runner")]++
			if !ssl || !strings.Contains(dn, "CN=postgres") {
				plain = append(plain, fmt.Sprintf("%q (ssl %t, client %q)", app, ssl, dn))
			}
		}
		if err == nil {
			err = rows.Err()
		}
		_ = conn.Close(ctx)
		if err != nil {
			o.Failures = append(o.Failures, fmt.Sprintf("read the sessions: %v", err))
			continue
		}
		if len(plain) > 0 {
			o.Failures = append(o.Failures, "sessions without TLS or without the client certificate: "+strings.Join(plain, ", "))
		}
		for _, p := range db.procs {
			if seen[string(p)] == 0 {
				o.Failures = append(o.Failures, fmt.Sprintf("%s has no session on its database at the end", p))
			}
		}
		var counts []string
		for _, app := range slices.Sorted(maps.Keys(seen)) {
			counts = append(counts, fmt.Sprintf("%s %d", app, seen[app]))
		}
		e.Saw("sessions on the database of %s and %s at the end, each over TLS with the client certificate CN=postgres: %s",
			db.procs[0], db.procs[1], strings.Join(counts, ", "))
	}
}

// checkTLSRefusals requires the servers to take TLS alone: a plain connection, and one over
// TLS without a client certificate, are refused by the broker and by both databases.
func checkTLSRefusals(ctx context.Context, e *Env, o *Outcome) {
	refused := func(what, with string, err error) {
		if err == nil {
			o.Failures = append(o.Failures, fmt.Sprintf("%s took a connection %s", what, with))
			return
		}
		e.Saw("%s refused a connection %s: %v", what, with, err)
	}
	b, err := url.Parse(e.Endpoints.AMQPURL)
	if err != nil {
		o.Failures = append(o.Failures, fmt.Sprintf("broker URL: %v", err))
		return
	}
	q := b.Query()
	plain, noCert := *b, *b
	plain.Scheme, plain.RawQuery = "amqp", ""
	noCert.RawQuery = url.Values{"cacertfile": {q.Get("cacertfile")}}.Encode()
	for _, c := range []struct {
		u    *url.URL
		with string
	}{{&plain, "without TLS"}, {&noCert, "over TLS without a client certificate"}} {
		conn, err := dialAMQP(ctx, c.u.String())
		if err == nil {
			_ = conn.Close()
		}
		refused("RabbitMQ", c.with, err)
	}
	for _, db := range []struct{ what, url string }{
		{"the orders PostgreSQL", e.Endpoints.OrdersDB}, {"the warehouse PostgreSQL", e.Endpoints.WarehouseDB},
	} {
		what := db.what
		d, err := url.Parse(db.url)
		if err != nil {
			o.Failures = append(o.Failures, fmt.Sprintf("database URL: %v", err))
			continue
		}
		dq := d.Query()
		plain, noCert := *d, *d
		plain.RawQuery = "sslmode=disable"
		noCert.RawQuery = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {dq.Get("sslrootcert")}}.Encode()
		for _, c := range []struct {
			u    *url.URL
			with string
		}{{&plain, "without TLS"}, {&noCert, "over TLS without a client certificate"}} {
			conn, err := openDB(ctx, c.u.String())
			if err == nil {
				_ = conn.Close(ctx)
			}
			refused(what, c.with, err)
		}
	}
}
