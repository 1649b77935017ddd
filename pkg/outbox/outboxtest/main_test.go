package outboxtest_test

import (
	"testing"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }
