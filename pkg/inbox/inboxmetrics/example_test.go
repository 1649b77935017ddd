package inboxmetrics_test

import (
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxmetrics"
)

// A consumer process exports its inbox retention beside the longest time a duplicate can
// still arrive: its own retries (5 attempts, 1s doubling to 30s) plus its producer relay's
// (10 attempts, 1s doubling to 5m). An alert fires when retention is not longer.
func ExampleWindow() {
	reg := prometheus.NewRegistry()
	w, err := inboxmetrics.NewWindow(reg, prometheus.Labels{"service": "warehouse"})
	if err != nil {
		log.Fatal(err)
	}
	redelivery := inboxmetrics.RetryWindow(5, time.Second, 30*time.Second) + inboxmetrics.RetryWindow(10, time.Second, 5*time.Minute)
	w.Set("warehouse", 7*24*time.Hour, redelivery)
	fmt.Println("a duplicate can arrive for", redelivery)
	// Output: a duplicate can arrive for 8m46s
}
