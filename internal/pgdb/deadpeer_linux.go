package pgdb

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT: data sent and not acknowledged by the peer for d
// closes the connection (ETIMEDOUT), as do keepalive probes unanswered for d.
func setUserTimeout(fd uintptr, d time.Duration) error {
	if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds())); err != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}
