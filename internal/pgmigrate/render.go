package pgmigrate

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// TemplateSuffix ends the name of every migration template: NNN_name.sql.tmpl.
const TemplateSuffix = ".sql.tmpl"

// Templates are a library's migrations as text/template files, one per version, each
// defining an "up" and a "down" template.
type Templates struct {
	files []templateFile
}

type templateFile struct {
	version int
	name    string // without version prefix and suffix
	source  string // path in the file system it was read from
	tmpl    *template.Template
}

// ParseTemplates reads dir/NNN_name.sql.tmpl from fsys, numbered 001, 002, … without gaps.
// Besides text/template's own, the templates may call literal, which writes a string as an
// SQL string literal.
func ParseTemplates(fsys fs.FS, dir string) (*Templates, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*"+TemplateSuffix))
	if err != nil {
		return nil, fmt.Errorf("list migration templates: %w", err)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("no migration templates in %s", dir)
	}
	t := &Templates{}
	for _, file := range names {
		base := strings.TrimSuffix(path.Base(file), TemplateSuffix)
		prefix, name, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(prefix)
		if err != nil || v != len(t.files)+1 || len(prefix) != 3 || name == "" {
			return nil, fmt.Errorf("migration template %s: want %03d_<name>%s", file, len(t.files)+1, TemplateSuffix)
		}
		src, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		tmpl, err := template.New(path.Base(file)).Option("missingkey=error").
			Funcs(template.FuncMap{"literal": literal}).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", file, err)
		}
		for _, part := range []string{"up", "down"} {
			if tmpl.Lookup(part) == nil {
				return nil, fmt.Errorf("migration template %s defines no %q template", file, part)
			}
		}
		t.files = append(t.files, templateFile{version: v, name: name, source: file, tmpl: tmpl})
	}
	return t, nil
}

// Render executes every template with data (the library's SQL names).
func (t *Templates) Render(data any) ([]Migration, error) {
	out := make([]Migration, 0, len(t.files))
	for _, f := range t.files {
		m := Migration{Version: f.version, Name: f.name}
		for _, part := range []struct {
			name string
			dst  *string
		}{{"up", &m.Up}, {"down", &m.Down}} {
			var b bytes.Buffer
			if err := f.tmpl.ExecuteTemplate(&b, part.name, data); err != nil {
				return nil, fmt.Errorf("render %s: %w", f.source, err)
			}
			*part.dst = strings.TrimSpace(b.String()) + "\n"
		}
		out = append(out, m)
	}
	return out, nil
}

// literal quotes s as an SQL string literal (standard_conforming_strings, the default since
// PostgreSQL 9.1). It refuses $$, which would end the dollar-quoted body it may stand in.
func literal(s string) (string, error) {
	if strings.Contains(s, "$$") {
		return "", fmt.Errorf("%q: a name used in a migration may not contain $$", s)
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'", nil
}

// ToolFiles returns ms as files for two migration tools, keyed by path:
// goose/NNN_name.sql (with -- +goose annotations, StatementBegin/End around the statements
// that hold a dollar-quoted body) and golang-migrate/NNN_name.up.sql and .down.sql. Each
// file starts with a comment naming source(m), the file it was generated from.
func (t *Templates) ToolFiles(ms []Migration) map[string][]byte {
	out := make(map[string][]byte, 3*len(ms))
	for i, m := range ms {
		base := fmt.Sprintf("%03d_%s", m.Version, m.Name)
		header := "-- Code generated from " + t.files[i].source + " by go generate; DO NOT EDIT.\n\n"
		var goose strings.Builder
		goose.WriteString(header)
		goose.WriteString("-- +goose Up\n")
		goose.WriteString(gooseStatements(m.Up))
		goose.WriteString("\n-- +goose Down\n")
		goose.WriteString(gooseStatements(m.Down))
		out["goose/"+base+".sql"] = []byte(goose.String())
		out["golang-migrate/"+base+".up.sql"] = []byte(header + m.Up)
		out["golang-migrate/"+base+".down.sql"] = []byte(header + m.Down)
	}
	return out
}

// gooseStatements wraps every statement of sql that holds a dollar-quoted body in
// StatementBegin/End, since goose would otherwise split it at the semicolons inside. A
// statement ends with a line ending in a semicolon outside dollar quotes; lines that only
// hold a comment belong to the statement after them.
func gooseStatements(sql string) string {
	var out, stmt, lead []string
	dollar, quoted := false, false
	for _, line := range strings.Split(strings.TrimSuffix(sql, "\n"), "\n") {
		trimmed := strings.TrimSpace(line)
		if !dollar && len(stmt) == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			lead = append(lead, line)
			continue
		}
		stmt = append(stmt, line)
		code, _, _ := strings.Cut(line, "--")
		if n := strings.Count(code, "$$"); n > 0 {
			quoted = true
			dollar = dollar != (n%2 == 1)
		}
		if dollar || !strings.HasSuffix(strings.TrimSpace(code), ";") {
			continue
		}
		out = append(out, lead...)
		if quoted {
			out = append(out, "-- +goose StatementBegin")
			out = append(out, stmt...)
			out = append(out, "-- +goose StatementEnd")
		} else {
			out = append(out, stmt...)
		}
		stmt, lead, quoted = nil, nil, false
	}
	out = append(out, lead...)
	out = append(out, stmt...)
	return strings.Join(out, "\n") + "\n"
}
