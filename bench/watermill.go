package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// peerTopic is the forwarder topic: Watermill keeps the outbox in the table
// watermill_<topic>.
const peerTopic = "outbox"

// peer is item 4: Watermill's forwarder (components/forwarder, watermill-sql's PostgreSQL
// subscriber on pgx, watermill-amqp's publisher with publisher confirms) drains rows
// OrderCreated events that the application wrote through the forwarder's publisher in
// transactions of 1,000. The clock runs from the forwarder's start until the queue received
// every message; the CPU of the bench's process (the forwarder), of its PostgreSQL backends
// and of the broker is sampled around the same span.
//
// The forwarder is configured as its documentation suggests for an outbox, plus what makes
// it fast: watermill-sql's default PostgreSQL schema and offsets adapter (batches of 100),
// and a pooled AMQP channel (without ChannelPoolSize it opens a channel per message).
func (e *env) peer(ctx context.Context, rows int) (float64, *CPUUsage, error) {
	top, err := e.declareTopology("peer")
	if err != nil {
		return 0, nil, err
	}
	dbURL, err := e.createDatabase(ctx, "peer", "")
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = e.dropDatabase(context.WithoutCancel(ctx), e.dbName("peer")) }()
	appName := "bench-" + e.id + "-peer"
	if dbURL, err = withAppName(dbURL, appName); err != nil {
		return 0, nil, err
	}
	pool, err := openPool(ctx, dbURL, 4)
	if err != nil {
		return 0, nil, err
	}
	defer pool.Close()
	logger := watermill.NopLogger{}
	schema := wsql.DefaultPostgreSQLSchema{}

	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     100 * time.Millisecond,
	}, logger)
	if err != nil {
		return 0, nil, fmt.Errorf("watermill subscriber: %w", err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(peerTopic); err != nil {
		return 0, nil, fmt.Errorf("watermill schema: %w", err)
	}

	start := time.Now()
	if err := fillPeer(ctx, pool, schema, rows); err != nil {
		return 0, nil, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE watermill_"+peerTopic); err != nil {
		return 0, nil, fmt.Errorf("vacuum analyze: %w", err)
	}
	e.progress("  filled Watermill's outbox with %s rows in %s", FormatCount(rows), time.Since(start).Round(time.Millisecond))

	pub, err := wamqp.NewPublisher(wamqp.Config{
		Connection: wamqp.ConnectionConfig{AmqpURI: e.cfg.AMQPURL},
		Marshaler:  wamqp.DefaultMarshaler{},
		Exchange: wamqp.ExchangeConfig{
			GenerateName: wamqp.GenerateExchangeNameConstant(top.Exchange),
			Type:         "topic",
			Durable:      true,
		},
		Publish: wamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
			ConfirmDelivery:    true,
			ChannelPoolSize:    1,
		},
		TopologyBuilder: &wamqp.DefaultTopologyBuilder{},
	}, logger)
	if err != nil {
		return 0, nil, fmt.Errorf("watermill amqp publisher: %w", err)
	}
	defer pub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: peerTopic, CloseTimeout: 10 * time.Second})
	if err != nil {
		return 0, nil, fmt.Errorf("watermill forwarder: %w", err)
	}

	snk, err := e.startSink(top.Queue, 200*time.Millisecond)
	if err != nil {
		return 0, nil, err
	}
	defer snk.Close()
	runErr := make(chan error, 1)
	meter := e.startCPU(ctx, appName)
	start = time.Now()
	go func() { runErr <- fwd.Run(ctx) }()
	got, at, waitErr := snk.waitFor(ctx, int64(rows), drainTimeout(rows))
	cpu := meter.stop(ctx, rows)
	closeErr := fwd.Close()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		closeErr = errors.Join(closeErr, err)
	}
	if waitErr != nil {
		return 0, nil, errors.Join(waitErr, closeErr)
	}
	if got > int64(rows) {
		e.progress("  the forwarder published %d messages for %d rows", got, rows)
	}
	return float64(rows) / at.Sub(start).Seconds(), cpu, nil
}

// fillPeer writes rows OrderCreated events through the forwarder's publisher on
// watermill-sql's publisher, in transactions of 1,000, as an application would.
func fillPeer(ctx context.Context, pool *pgxpool.Pool, schema wsql.SchemaAdapter, rows int) error {
	const perTx = 1000
	for done := 0; done < rows; done += perTx {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
			if err != nil {
				return err
			}
			pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: peerTopic})
			msgs := make([]*message.Message, min(perTx, rows-done))
			for i := range msgs {
				_, m := orderEvent("", done+i)
				msgs[i] = message.NewMessage(m.ID.String(), message.Payload(m.Payload))
			}
			return pub.Publish("order.created", msgs...)
		})
		if err != nil {
			return fmt.Errorf("fill watermill outbox: %w", err)
		}
	}
	return nil
}
