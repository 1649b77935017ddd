package pgdb_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/pgdb"
	"github.com/outboxshop/outboxshop/internal/testinfra"
	"github.com/outboxshop/outboxshop/internal/tlsfiles"
)

// TestWithTLSFiles adds the files to a URL without touching the rest of it: a path with a
// space stays a space (not the "+" url.Values would write, which libpq's parser and pgx's
// read as a plus), the URL's own parameters stay as they were, and every host of a
// multi-host URL is checked for its own name.
func TestWithTLSFiles(t *testing.T) {
	t.Parallel()
	files := testinfra.NewTLSFiles(t)
	dir := filepath.Join(t.TempDir(), "my certs+keys")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	ca := filepath.Join(dir, "ca & co.pem")
	pem, err := os.ReadFile(files.CAFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(ca, pem, 0o600))

	u := "postgres://u:p@h1:5432,h2:5433/db?sslmode=verify-full&options=-c%20search_path%3Dmyschema&target_session_attrs=read-write"
	out, err := pgdb.WithTLSFiles(u, tlsfiles.Files{CA: ca, Cert: files.ClientCertFile, Key: files.ClientKeyFile}, "ORDERS_DATABASE_")
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(out) // reads the files: the paths must survive
	require.NoError(t, err, out)
	require.Equal(t, "-c search_path=myschema", cfg.ConnConfig.RuntimeParams["options"])
	require.Equal(t, "h1", cfg.ConnConfig.TLSConfig.ServerName)
	require.NotNil(t, cfg.ConnConfig.TLSConfig.RootCAs)
	require.Len(t, cfg.ConnConfig.TLSConfig.Certificates, 1)
	require.Len(t, cfg.ConnConfig.Fallbacks, 1)
	require.Equal(t, "h2", cfg.ConnConfig.Fallbacks[0].TLSConfig.ServerName)

	same, err := pgdb.WithTLSFiles(u, tlsfiles.Files{}, "ORDERS_DATABASE_")
	require.NoError(t, err)
	require.Equal(t, u, same, "no file: the URL as it is")
}
