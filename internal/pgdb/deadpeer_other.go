//go:build !linux

package pgdb

import "time"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist: the keepalive probes
// alone bound an idle connection.
func setUserTimeout(uintptr, time.Duration) error { return nil }
