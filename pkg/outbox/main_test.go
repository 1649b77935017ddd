package outbox_test

import (
	"os"
	"testing"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild() // a relay process that a test will kill; never returns
	}
	testinfra.Main(m)
}
