package service

import "testing"

// TestReplicationURL drops pgxpool's settings, which a lone connection would send to the
// server as its own, and keeps every other parameter as it is written: re-encoded, a %20
// would become a "+", which pgx reads as a plus.
func TestReplicationURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h/db?pool_max_conns=10&sslmode=verify-full&sslrootcert=%2Fmy%20certs%2Fca.pem&options=-c%20x%3Dy": "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fmy%20certs%2Fca.pem&options=-c%20x%3Dy",
		"postgres://u@h1,h2/db?pool_min_conns=1": "postgres://u@h1,h2/db",
		"host=h dbname=db pool_max_conns=10":     "host=h dbname=db pool_max_conns=10",
		"postgresql://u@h/db?sslmode=disable":    "postgresql://u@h/db?sslmode=disable",
	} {
		if got := replicationURL(in); got != want {
			t.Errorf("replicationURL(%q) = %q, want %q", in, got, want)
		}
	}
}
