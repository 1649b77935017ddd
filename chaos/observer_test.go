package chaos

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDeliveries(t *testing.T) {
	t.Parallel()

	t.Run("ZeroValue", func(t *testing.T) {
		t.Parallel()
		var d Deliveries
		c := d.Counts()
		require.Zero(t, c.Total)
		require.Zero(t, c.Duplicates)
		require.Empty(t, c.DuplicateIDs)
	})

	t.Run("DuplicatesAreDeliveriesMinusDistinctIDs", func(t *testing.T) {
		t.Parallel()
		var d Deliveries
		d.Add("a", "order.created")
		d.Add("b", "order.created")
		d.Add("a", "order.created") // the relay published a twice
		d.Add("c", "stock.reserved")
		d.Add("a", "order.created") // and a third time
		c := d.Counts()
		require.Equal(t, 5, c.Total)
		require.Equal(t, 3, c.Distinct)
		require.Equal(t, 2, c.Duplicates)
		require.Equal(t, []string{"a"}, c.DuplicateIDs)
		require.Equal(t, map[string]int{"order.created": 4, "stock.reserved": 1}, c.ByRoutingKey)
	})

	t.Run("SampleOfDuplicateIDsIsBounded", func(t *testing.T) {
		t.Parallel()
		var d Deliveries
		for i := range 20 {
			id := fmt.Sprintf("id-%02d", i)
			d.Add(id, "k")
			d.Add(id, "k")
		}
		c := d.Counts()
		require.Equal(t, 20, c.Duplicates)
		require.Equal(t, []string{"id-00", "id-01", "id-02", "id-03", "id-04"}, c.DuplicateIDs)
	})

	t.Run("ConcurrentAdds", func(t *testing.T) {
		t.Parallel()
		var d Deliveries
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 100 {
					d.Add(fmt.Sprintf("%d-%d", w, i%50), "k")
				}
			})
		}
		wg.Wait()
		c := d.Counts()
		require.Equal(t, 800, c.Total)
		require.Equal(t, 400, c.Distinct)
		require.Equal(t, 400, c.Duplicates)
	})
}
