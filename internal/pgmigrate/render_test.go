package pgmigrate

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestParseTemplates(t *testing.T) {
	t.Parallel()
	both := `{{define "up"}}CREATE TABLE {{.T}} ();{{end}}{{define "down"}}DROP TABLE {{.T}};{{end}}`
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		err   string
	}{
		{"Gap", fstest.MapFS{"m/001_a.sql.tmpl": {Data: []byte(both)}, "m/003_c.sql.tmpl": {Data: []byte(both)}}, "want 002_<name>"},
		{"NoName", fstest.MapFS{"m/001.sql.tmpl": {Data: []byte(both)}}, "want 001_<name>"},
		{"NoDown", fstest.MapFS{"m/001_a.sql.tmpl": {Data: []byte(`{{define "up"}}x{{end}}`)}}, `no "down" template`},
		{"Empty", fstest.MapFS{"m/README": {Data: []byte("x")}}, "no migration templates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTemplates(tc.files, "m")
			require.ErrorContains(t, err, tc.err)
		})
	}

	t.Run("Render", func(t *testing.T) {
		tmpl, err := ParseTemplates(fstest.MapFS{
			"m/001_a.sql.tmpl": {Data: []byte(both)},
			"m/002_b.sql.tmpl": {Data: []byte(`{{define "up"}}SELECT {{literal .T}};{{end}}{{define "down"}}{{end}}`)},
		}, "m")
		require.NoError(t, err)
		ms, err := tmpl.Render(struct{ T string }{`it's`})
		require.NoError(t, err)
		require.Equal(t, []Migration{
			{Version: 1, Name: "a", Up: "CREATE TABLE it's ();\n", Down: "DROP TABLE it's;\n"},
			{Version: 2, Name: "b", Up: "SELECT 'it''s';\n", Down: "\n"},
		}, ms)
		_, err = tmpl.Render(struct{ T string }{`a$$b`})
		require.ErrorContains(t, err, "may not contain $$")
		_, err = tmpl.Render(struct{ U string }{"x"})
		require.Error(t, err, "a name the templates use is missing")
	})
}

func TestGooseStatements(t *testing.T) {
	t.Parallel()
	in := `-- a comment; with a semicolon
CREATE TABLE t (a int);

-- the function
CREATE FUNCTION f() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL; -- inside
END;
$$;
DO $$ BEGIN PERFORM 1; END $$;
DROP TABLE t;
`
	want := `-- a comment; with a semicolon
CREATE TABLE t (a int);

-- the function
-- +goose StatementBegin
CREATE FUNCTION f() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL; -- inside
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$ BEGIN PERFORM 1; END $$;
-- +goose StatementEnd
DROP TABLE t;
`
	require.Equal(t, want, gooseStatements(in))
}
