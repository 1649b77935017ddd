package loadgen_test

import (
	"context"
	"fmt"

	"github.com/outboxshop/outboxshop/loadgen"
	"github.com/outboxshop/outboxshop/loadgen/internal/fakeshop"
)

// Place 20 orders at 100 per second, half of them sent twice with their Idempotency-Key, and
// check what a chaos scenario would check.
func Example() {
	shop, stop := fakeshop.Start() // a stand-in for the orders API
	defer stop()

	res, err := loadgen.Run(context.Background(), loadgen.Config{
		OrdersURL: shop.URL, Rate: 100, Count: 20, DuplicateFraction: 0.5, Seed: 1,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("placed:", res.Placed)
	fmt.Println("acknowledged:", len(res.Acknowledged))
	fmt.Println("every duplicate replayed:", res.Duplicates > 0 && res.Duplicates == res.Replays)
	fmt.Println("errors:", res.Errors)
	// Output:
	// placed: 20
	// acknowledged: 20
	// every duplicate replayed: true
	// errors: map[]
}
