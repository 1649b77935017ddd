package app_test

import (
	"testing"

	"github.com/outboxshop/outboxshop/internal/deadletters/deadletterstest"
	"github.com/outboxshop/outboxshop/services/warehouse/app"
)

// TestDeadLettersCommand runs `warehouse dead-letters` against the broker
// (deadletterstest.CheckCommand, the same check in both services).
func TestDeadLettersCommand(t *testing.T) {
	t.Parallel()
	deadletterstest.CheckCommand(t, app.ServiceName, app.Command().Run)
}
