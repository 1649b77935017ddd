// Command healthcheck GETs a URL and exits 0 on a 2xx answer, 1 otherwise: the health probe
// of the outboxshop images, which have no shell or curl. See package
// github.com/outboxshop/outboxshop/tools/healthcheck.
//
//	healthcheck [-timeout 3s] http://127.0.0.1:8080/readyz
package main

import (
	"context"
	"os"

	"github.com/outboxshop/outboxshop/tools/healthcheck"
)

func main() { os.Exit(healthcheck.Main(context.Background(), os.Args[1:], os.Stderr)) }
