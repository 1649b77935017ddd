package loadgen_test

import (
	"testing"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

// TestMain finds (or starts) PostgreSQL and RabbitMQ for the integration test, and fails the
// run when a test leaked a goroutine.
func TestMain(m *testing.M) { testinfra.Main(m) }
