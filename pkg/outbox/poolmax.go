package outbox

import "github.com/jackc/pgx/v5/pgxpool"

// poolStater is implemented by a pool that tells its size, as *pgxpool.Pool does. A pool
// need not implement it; a component given one that does not cannot check its size.
//
// The outbox's relay and the inbox's consumer report their PoolSize the same way: this file
// is the outbox's, and tools/cmd/gencopies copies it into pkg/inbox/inboxrabbitmq.
type poolStater interface {
	Stat() *pgxpool.Stat
}

// poolMax is the largest size of db when it tells it, 0 otherwise.
func poolMax(db any) int {
	if p, ok := db.(*pgxpool.Pool); ok && p == nil { // a placeholder that is never used
		return 0
	}
	if p, ok := db.(poolStater); ok {
		if st := p.Stat(); st != nil {
			return int(st.MaxConns())
		}
	}
	return 0
}
