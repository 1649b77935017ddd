package inboxrabbitmq

import "time"

// SetLogInterval sets the LogInterval of c's failure streaks (retry.DefaultLogInterval by
// default), so that a test of a few seconds sees the lines of a longer outage. Call it
// before Run.
func (c *Consumer) SetLogInterval(d time.Duration) { c.logInterval = d }
