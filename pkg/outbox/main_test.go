package outbox_test

import (
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/outboxshop/outboxshop/pkg/outbox/internal/testinfra"
)

func TestMain(m *testing.M) {
	otel.SetTextMapPropagator(w3c) // as an application using OpenTelemetry does; Add uses it
	if os.Getenv(childEnv) != "" {
		if d, err := time.ParseDuration(os.Getenv(childPause)); err == nil {
			runPausedChild(d) // a relay process that stops itself; never returns
		}
		runChild() // a relay process that a test will kill; never returns
	}
	testinfra.Main(m)
}
