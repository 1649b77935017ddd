package chaos

import (
	"reflect"
	"strings"
	"sync"

	"github.com/outboxshop/outboxshop/internal/envconfig"

	ordersapp "github.com/outboxshop/outboxshop/services/orders/app"
	warehouseapp "github.com/outboxshop/outboxshop/services/warehouse/app"
)

// envNames lists the environment variables a configuration struct reads (its env tags,
// those of embedded settings under their prefix: envconfig.VariablesOf).
func envNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for _, name := range envconfig.VariablesOf(t) {
		names[name] = true
	}
	return names
}

// serviceSettings are the variables each service reads, by prefix.
var serviceSettings = sync.OnceValue(func() map[string]map[string]bool {
	return map[string]map[string]bool{
		"ORDERS_":    envNames(reflect.TypeFor[ordersapp.Config]()),
		"WAREHOUSE_": envNames(reflect.TypeFor[warehouseapp.Config]()),
	}
})

// unreadSettings returns the settings ("NAME=value") that no service reads: a scenario may
// name a setting its service does not have yet, and runs on the default meanwhile; the
// runner says so rather than letting it pass unnoticed.
func unreadSettings(settings []string) []string {
	var out []string
	for _, kv := range settings {
		name, _, _ := strings.Cut(kv, "=")
		read := false
		for prefix, names := range serviceSettings() {
			if strings.HasPrefix(name, prefix) && names[name] {
				read = true
			}
		}
		if !read {
			out = append(out, kv)
		}
	}
	return out
}
