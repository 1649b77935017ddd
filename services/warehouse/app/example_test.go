package app_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

// Start runs the whole warehouse in the calling process, here on a free port and a database
// and broker names of its own: it creates and migrates the database, which then holds the
// catalogue.
func ExampleApp_Start() {
	ctx := context.Background()
	suffix := randomSuffix()
	cfg := app.DefaultConfig()
	cfg.DatabaseURL = databaseURL("warehouse_example_" + suffix) // created by Start
	cfg.AMQPURL = os.Getenv("OUTBOXSHOP_TEST_AMQP_URL")
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.EventsExchange = "example.events." + suffix
	cfg.DeadLetterExchange = "example.dlx." + suffix
	cfg.Queue = "example.warehouse.orders." + suffix
	cfg.DeadLetterQueue = "example.warehouse.orders.dead." + suffix
	defer cleanUp(cfg, "warehouse_example_"+suffix)

	a, err := app.New(cfg, app.ModeAll, app.Options{})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	res, err := http.Get("http://" + a.HTTPAddr() + "/stock/BOOK-1")
	if err != nil {
		panic(err)
	}
	res.Body.Close()
	fmt.Println(res.Status)

	if err := a.Stop(); err != nil { // or cancel ctx
		panic(err)
	}
	fmt.Println("stopped")
	// Output:
	// 200 OK
	// stopped
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// databaseURL is the URL of a database called name on the test server.
func databaseURL(name string) string {
	u, err := url.Parse(os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL"))
	if err != nil {
		panic(err)
	}
	u.Path = "/" + name
	return u.String()
}

// cleanUp drops the example's database, queues and exchanges.
func cleanUp(cfg app.Config, database string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("OUTBOXSHOP_TEST_POSTGRES_URL"))
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{database}.Sanitize()+" WITH (FORCE)"); err != nil {
		panic(err)
	}
	broker, err := amqp091.Dial(cfg.AMQPURL)
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	ch, err := broker.Channel()
	if err != nil {
		panic(err)
	}
	for _, q := range []string{cfg.Queue, cfg.DeadLetterQueue} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			panic(err)
		}
	}
	for _, ex := range []string{cfg.EventsExchange, cfg.DeadLetterExchange} {
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			panic(err)
		}
	}
}
