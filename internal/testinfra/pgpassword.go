package testinfra

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// passwordHBA is the pg_hba.conf of [StartPasswordServer]: the superuser postgres is trusted,
// as on every other server of this package, so that the start-up and the test's own set-up
// need no password; every other role must send its password (SCRAM).
const passwordHBA = `local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
`

// StartPasswordServer starts a private PostgreSQL server ([StartServer]) that checks
// passwords, for tests of what a wrong one does, or of where a right one shows: the shared
// server of OUTBOXSHOP_TEST_POSTGRES_URL may trust every connection, and its settings are not
// the tests' to change. Connections as postgres are trusted; create the roles the test logs
// in as through [PostgresServer.URL] with a PASSWORD. The server is stopped and its
// directory removed when the test ends. Without the server binaries the test is skipped, or
// fails under CI=true.
func StartPasswordServer(t testing.TB) *PostgresServer {
	t.Helper()
	// The server's user reads the file: a directory of its own, open to every user (the
	// test's temporary directory is not).
	dir, err := os.MkdirTemp("", "outbox-pghba-")
	if err != nil {
		t.Fatalf("pg_hba.conf: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	hba := filepath.Join(dir, "pg_hba.conf")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("pg_hba.conf: %v", err)
	}
	if err := os.WriteFile(hba, []byte(passwordHBA), 0o644); err != nil {
		t.Fatalf("pg_hba.conf: %v", err)
	}
	s, stop, err := StartServer("-c", "hba_file="+hba, "-c", "password_encryption=scram-sha-256")
	t.Cleanup(stop)
	if err != nil {
		var missing *missingError
		if errors.As(err, &missing) {
			unavailable(t, "a private PostgreSQL server", err)
		}
		t.Fatalf("private PostgreSQL server: %v", err)
	}
	return s
}
