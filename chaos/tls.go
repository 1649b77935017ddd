package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// tlsServers are a shop's own servers when it runs on TLS (ShopSpec.TLS): a PostgreSQL
// server per service and a RabbitMQ node, each taking TLS alone and asking every client for
// a certificate of a CA made for the shop. Everything, the certificates too, is in dir,
// removed with the servers.
type tlsServers struct {
	dir                 string
	files               *testinfra.TLSFiles
	ordersPG, warehouse *pgServer
	rabbit              *rabbitServer
}

// startTLSServers makes the certificates (a CA, a server certificate for localhost, a client
// certificate for the user postgres) and starts the three servers: the databases as
// copies of template, the target's server (faster than initdb), the node as node.
func startTLSServers(ctx context.Context, dir, node string, template *pgServer) (*tlsServers, error) {
	t := &tlsServers{dir: dir}
	// The servers run as their own users and must reach their directories; the runner's
	// files, the client key among them, are its own.
	certs := filepath.Join(dir, "certs")
	if err := errors.Join(os.MkdirAll(dir, 0o755), os.Mkdir(certs, 0o700)); err != nil {
		return t, err
	}
	var err error
	if t.files, err = testinfra.WriteTLSFiles(certs); err != nil {
		return t, fmt.Errorf("TLS certificates: %w", err)
	}
	if t.ordersPG, err = newPGServer("orders-db", filepath.Join(dir, "pg-orders")); err != nil {
		return t, err
	}
	if t.warehouse, err = newPGServer("warehouse-db", filepath.Join(dir, "pg-warehouse")); err != nil {
		return t, err
	}
	if t.rabbit, err = newRabbitServer(node, filepath.Join(dir, "rabbitmq")); err != nil {
		return t, err
	}
	t.rabbit.tls = t.files
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		if errs[0] = t.rabbit.init(); errs[0] == nil {
			errs[0] = t.rabbit.start(ctx)
		}
	})
	// One copy after the other, while the node starts: two at once from one server, each
	// asking for a fast checkpoint, can remove the WAL the other is still to stream
	// ("requested WAL segment … has already been removed").
	wg.Go(func() {
		for _, pg := range []*pgServer{t.ordersPG, t.warehouse} {
			if errs[1] = pg.clone(ctx, template, false); errs[1] != nil {
				return
			}
			if errs[1] = pg.useTLS(t.files); errs[1] != nil {
				return
			}
			if errs[1] = pg.start(ctx); errs[1] != nil {
				return
			}
		}
	})
	wg.Wait()
	return t, errors.Join(errs...)
}

// settings are the TLS settings of the service of prefix ("ORDERS_", "WAREHOUSE_"): the CA
// that signed the servers' certificates, and the client certificate, for the broker and for
// the database.
func (t *tlsServers) settings(prefix string) []string {
	f := t.files
	var out []string
	for _, of := range []string{"AMQP_", "DATABASE_"} {
		out = append(out, prefix+of+"CA_FILE="+f.CAFile, prefix+of+"CERT_FILE="+f.ClientCertFile, prefix+of+"KEY_FILE="+f.ClientKeyFile)
	}
	return out
}

// remove kills the servers and deletes their directory, the certificates with it.
func (t *tlsServers) remove(ctx context.Context) error {
	var errs []error
	if t.rabbit != nil {
		errs = append(errs, t.rabbit.kill(ctx))
	}
	for _, pg := range []*pgServer{t.ordersPG, t.warehouse} {
		if pg != nil {
			errs = append(errs, pg.kill(ctx))
		}
	}
	return errors.Join(append(errs, os.RemoveAll(t.dir))...)
}

// servers are the current shop's database servers and broker node: its own when it runs on
// TLS, else the target's.
func (l *Local) servers() (orders, warehouse *pgServer, rabbit *rabbitServer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shop != nil && l.shop.tls != nil {
		return l.shop.tls.ordersPG, l.shop.tls.warehouse, l.shop.tls.rabbit
	}
	if l.shop != nil && l.shop.lab != nil && l.shop.lab.warehouse != nil {
		return l.ordersPG, l.shop.lab.warehouse, l.rabbit
	}
	return l.ordersPG, l.warehouse, l.rabbit
}
