package e2e_test

import (
	"testing"

	"github.com/outboxshop/outboxshop/internal/testinfra"
)

func TestMain(m *testing.M) { testinfra.Main(m) }
