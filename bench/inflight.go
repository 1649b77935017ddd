package bench

import (
	"fmt"
	"reflect"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// inFlightField is the outbox.Config field that bounds the batches a relay has in flight at
// once: 1 is the serial relay (claim, publish, confirm, mark, then the next claim); more
// pipeline the cycle.
const inFlightField = "InFlightBatches"

// setInFlight sets cfg's batches in flight to n. It reaches the field by name so that the
// bench builds against a pkg/outbox with or without the pipelined relay; without it, only
// n = 1 (the serial relay) can be measured, and other values are an error that shows in
// their rows.
func setInFlight(cfg *outbox.Config, n int) error {
	f := reflect.ValueOf(cfg).Elem().FieldByName(inFlightField)
	if !f.IsValid() || !f.CanSet() || f.Kind() != reflect.Int {
		if n == 1 {
			return nil
		}
		return fmt.Errorf("this pkg/outbox has no Config.%s: no pipelined relay to measure", inFlightField)
	}
	f.SetInt(int64(n))
	return nil
}
