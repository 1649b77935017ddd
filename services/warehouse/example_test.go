package warehouse_test

import (
	"fmt"

	"github.com/outboxshop/outboxshop/services/warehouse"
)

// An order is reserved all or nothing: one short line rejects it whole, with every shortage.
func ExampleCheckStock() {
	order := warehouse.MergeLines([]warehouse.Line{
		{SKU: "MUG-1", Quantity: 2},
		{SKU: "BOOK-1", Quantity: 1},
		{SKU: "MUG-1", Quantity: 1},
	})
	fmt.Println(order)

	d := warehouse.CheckStock(order, map[string]int64{"BOOK-1": 100, "MUG-1": 50})
	fmt.Println(d)

	d = warehouse.CheckStock(order, map[string]int64{"BOOK-1": 100, "MUG-1": 2})
	fmt.Println(d, d.Shortages)
	// Output:
	// [{BOOK-1 1} {MUG-1 3}]
	// reserve
	// reject (insufficient_stock) [{MUG-1 3 2}]
}

// The cancellation of an order the warehouse has not seen leaves a tombstone, so that the
// late order is rejected instead of reserved.
func ExampleDecideCancelled() {
	fmt.Println(warehouse.DecideCancelled(nil))
	tombstone := &warehouse.Reservation{Status: warehouse.StatusCancelled, CancelledMessageID: "m-1"}
	fmt.Println(warehouse.DecideCreated(tombstone))
	// Output:
	// tombstone
	// reject (order_cancelled)
}
