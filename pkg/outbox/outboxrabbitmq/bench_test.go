package outboxrabbitmq_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/outbox"
	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
	"github.com/outboxshop/outboxshop/pkg/outbox/outboxrabbitmq"
)

// BenchmarkPublish measures a confirmed batch of 500 persistent messages; msgs/s is the
// publisher's ceiling, which the relay's throughput is compared with.
func BenchmarkPublish(b *testing.B) {
	url := testinfra.AMQPURL(b)
	top := testinfra.DeclareTopology(b, url)
	pub, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: url})
	require.NoError(b, err)
	defer pub.Close()
	batch := make([]outbox.Message, 500)
	for i := range batch {
		batch[i] = message(top.Exchange)
	}
	ctx := context.Background()
	var n int
	for b.Loop() {
		for _, err := range pub.Publish(ctx, batch) {
			require.NoError(b, err)
		}
		n += len(batch)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}
