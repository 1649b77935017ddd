package inboxmetrics_test

import (
	"testing"

	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }
