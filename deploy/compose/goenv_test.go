package compose_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// envVar is an environment variable a Go program reads, as its source says.
type envVar struct {
	Name       string
	Default    string // its default, when a string literal says it
	HasDefault bool
	Required   bool   // the `required` or `notEmpty` option of caarlos0/env
	Where      string // file:line
}

// NeedsValue reports whether a container must be given the variable: it is required, or its
// default names the developer's machine (127.0.0.1, localhost), which in a container is the
// container itself.
func (v envVar) NeedsValue() bool {
	return v.Required || strings.Contains(v.Default, "127.0.0.1") || strings.Contains(v.Default, "localhost")
}

// The module path of this repository: only its packages are read.
const repoModule = "github.com/outboxshop/outboxshop"

var programEnvs sync.Map // package path → func() (map[string]envVar, error)

// programEnv returns the environment variables that the binary pkg (./services/orders/cmd/orders,
// …) reads: those of every package of this repository that it links, found by [packageEnv].
func programEnv(t *testing.T, pkg string) map[string]envVar {
	t.Helper()
	f, _ := programEnvs.LoadOrStore(pkg, sync.OnceValues(func() (map[string]envVar, error) { return readProgramEnv(pkg) }))
	vars, err := f.(func() (map[string]envVar, error))()
	require.NoError(t, err, "read the environment variables of %s", pkg)
	return vars
}

func readProgramEnv(pkg string) (map[string]envVar, error) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Dir,GoFiles,Module", pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %w: %s", pkg, err, stderr.String())
	}
	type pkgFiles struct {
		importPath string
		files      map[string][]byte
	}
	var pkgs []pkgFiles
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath, Dir string
			GoFiles         []string
			Module          *struct{ Path string }
		}
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		if p.Module == nil || !strings.HasPrefix(p.Module.Path, repoModule) {
			continue
		}
		files := map[string][]byte{}
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				return nil, err
			}
			rel, _ := filepath.Rel(repoRoot, filepath.Join(p.Dir, f))
			files[rel] = b
		}
		pkgs = append(pkgs, pkgFiles{p.ImportPath, files})
	}
	// Settings structs one package declares and another embeds under a prefix
	// (service.RelayEnv `env:"ORDERS_"`): the first pass finds them, the second reads their
	// variables under the prefix of the field that embeds them, not on their own.
	prog := program{structs: map[string]*ast.StructType{}, embedded: map[string]bool{}}
	for _, p := range pkgs {
		if err := prog.add(p.importPath, p.files); err != nil {
			return nil, fmt.Errorf("%s: %w", p.importPath, err)
		}
	}
	vars := map[string]envVar{}
	for _, p := range pkgs {
		pv, err := prog.packageEnv(p.importPath, p.files)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.importPath, err)
		}
		for name, v := range pv {
			if old, ok := vars[name]; ok && old.HasDefault && !v.HasDefault {
				continue
			}
			vars[name] = v
		}
	}
	return vars, nil
}

// program holds the struct types of every package of a program, by "package.Type", and
// those a field of another package embeds under a prefix.
type program struct {
	structs  map[string]*ast.StructType
	embedded map[string]bool
}

// add records the struct types of the package importPath, and the types of other packages
// its struct fields embed under a prefix (an envPrefix tag, or an env tag on a field of a
// qualified type).
func (p *program) add(importPath string, files map[string][]byte) error {
	pkg := importPath[strings.LastIndex(importPath, "/")+1:]
	for name, src := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			p.structs[pkg+"."+ts.Name.Name] = st
			for _, field := range st.Fields.List {
				sel, ok := field.Type.(*ast.SelectorExpr)
				if !ok {
					continue
				}
				tag := fieldTag(field)
				_, hasPrefix := tag.Lookup("envPrefix")
				_, hasEnv := tag.Lookup("env")
				if x, ok := sel.X.(*ast.Ident); ok && (hasPrefix || hasEnv) {
					p.embedded[x.Name+"."+sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	return nil
}

// packageEnv is packageEnv of the package importPath of the program.
func (p *program) packageEnv(importPath string, files map[string][]byte) (map[string]envVar, error) {
	return packageEnvOf(files, importPath[strings.LastIndex(importPath, "/")+1:], p)
}

// flagFuncs are the flag package's definitions: name → whether the first argument is the
// variable (StringVar(&v, name, default, usage)) rather than the name.
var flagFuncs = map[string]bool{
	"String": false, "Int": false, "Int64": false, "Uint": false, "Uint64": false, "Float64": false,
	"Bool": false, "Duration": false, "Func": false, "BoolFunc": false,
	"StringVar": true, "IntVar": true, "Int64Var": true, "UintVar": true, "Uint64Var": true,
	"Float64Var": true, "BoolVar": true, "DurationVar": true, "TextVar": true, "Var": true,
}

// packageEnv finds, in the Go files of one package (file name → source), the environment
// variables it reads:
//
//   - caarlos0/env struct tags: `env:"NAME,required"`, `envDefault:"…"`, nested structs'
//     `envPrefix:"…"` (or their `env:"…"`, which internal/envconfig takes as the prefix of a
//     struct field), and the Prefix of an env.Options literal in the package, which applies
//     to every struct of it. A string in a composite literal of such a struct (a DefaultConfig
//     function) is the field's default too;
//   - os.Getenv and os.LookupEnv of a string constant;
//   - flags whose environment variable a function of the package names: a func with one string
//     parameter and a string result whose name contains "env" (envName(flag) string), made of
//     returns, ifs comparing the parameter with a constant, string constants, + and the
//     strings functions ToUpper, ToLower, ReplaceAll, Replace and TrimSpace. It is evaluated
//     for the name of every flag that the package defines; the flag's default is the
//     variable's.
func packageEnv(files map[string][]byte) (map[string]envVar, error) {
	return packageEnvOf(files, "", &program{})
}

// packageEnvOf is [packageEnv] of the package pkg of prog: a field of a struct type of
// another package of prog (service.RelayEnv) reads that struct's variables under its prefix,
// and a struct type of pkg that another package embeds so is not read on its own.
func packageEnvOf(files map[string][]byte, pkg string, prog *program) (map[string]envVar, error) {
	fset := token.NewFileSet()
	var parsed []*ast.File
	for name, src := range files {
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, f)
	}
	imported := func(f *ast.File, path string) string { // the name a file imports path under
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == path {
				if imp.Name != nil {
					return imp.Name.Name
				}
				return path[strings.LastIndex(path, "/")+1:]
			}
		}
		return ""
	}
	isCall := func(e ast.Expr, pkgName string, funcs ...string) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok || pkgName == "" {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == pkgName && (len(funcs) == 0 || slices.Contains(funcs, sel.Sel.Name))
	}

	consts := map[string]string{}
	structs := map[string]*ast.StructType{}
	var funcs []*ast.FuncDecl
	for _, f := range parsed {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for i, n := range s.Names {
							if i < len(s.Values) {
								if v, ok := stringLit(s.Values[i]); ok {
									consts[n.Name] = v
								}
							}
						}
					case *ast.TypeSpec:
						if st, ok := s.Type.(*ast.StructType); ok {
							structs[s.Name.Name] = st
						}
					}
				}
			case *ast.FuncDecl:
				funcs = append(funcs, d)
			}
		}
	}
	constOf := func(e ast.Expr) (string, bool) {
		if v, ok := stringLit(e); ok {
			return v, true
		}
		if id, ok := e.(*ast.Ident); ok {
			v, ok := consts[id.Name]
			return v, ok
		}
		return "", false
	}

	// The Prefix of env.Options literals.
	prefix := ""
	var errs []error
	for _, f := range parsed {
		envPkg := imported(f, "github.com/caarlos0/env/v11")
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok || !isCall(cl.Type, envPkg, "Options") {
				return true
			}
			for _, el := range cl.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Prefix" {
						p, ok := constOf(kv.Value)
						switch {
						case !ok:
							errs = append(errs, fmt.Errorf("%s: env.Options Prefix is not a constant", fset.Position(kv.Pos())))
						case prefix != "" && p != prefix:
							errs = append(errs, fmt.Errorf("%s: a second env.Options Prefix %q (first %q)", fset.Position(kv.Pos()), p, prefix))
						default:
							prefix = p
						}
					}
				}
			}
			return true
		})
	}

	vars := map[string]envVar{}
	fieldVars := map[string]map[string]string{} // struct → field → variable
	nested := map[string]bool{}
	// prefixOf is the prefix a field gives the variables of its struct: its envPrefix tag, or
	// the env tag of a field whose type is a struct (internal/envconfig reads it so).
	structOf := func(name string) *ast.StructType {
		if st := structs[name]; st != nil {
			return st
		}
		return prog.structs[name] // package.Type
	}
	prefixOf := func(field *ast.Field) (string, bool) {
		tag := fieldTag(field)
		if p, ok := tag.Lookup("envPrefix"); ok {
			return p, true
		}
		if p, ok := tag.Lookup("env"); ok && structOf(typeName(field.Type)) != nil {
			return p, true
		}
		return "", false
	}
	for _, st := range structs {
		for _, field := range st.Fields.List {
			if _, ok := prefixOf(field); ok {
				nested[typeName(field.Type)] = true
			}
		}
	}
	var walk func(structName, prefix string, depth int)
	walk = func(structName, prefix string, depth int) {
		st := structOf(structName)
		if st == nil || depth > 10 {
			return
		}
		for _, field := range st.Fields.List {
			tag := fieldTag(field)
			if p, ok := prefixOf(field); ok {
				walk(typeName(field.Type), prefix+p, depth+1)
				continue
			}
			spec, ok := tag.Lookup("env")
			if !ok {
				continue
			}
			name, opts, _ := strings.Cut(spec, ",")
			if name == "" {
				continue
			}
			v := envVar{Name: prefix + name, Where: fset.Position(field.Pos()).String()}
			for o := range strings.SplitSeq(opts, ",") {
				if o == "required" || o == "notEmpty" {
					v.Required = true
				}
			}
			v.Default, v.HasDefault = tag.Lookup("envDefault")
			vars[v.Name] = v
			for _, n := range field.Names {
				if fieldVars[structName] == nil {
					fieldVars[structName] = map[string]string{}
				}
				fieldVars[structName][n.Name] = v.Name
			}
		}
	}
	for name := range structs {
		if !nested[name] && !prog.embedded[pkg+"."+name] {
			walk(name, prefix, 0)
		}
	}

	var envFunc *ast.FuncDecl
	for _, fn := range funcs {
		if fn.Recv == nil && strings.Contains(strings.ToLower(fn.Name.Name), "env") && isStringToString(fn) {
			if envFunc != nil {
				errs = append(errs, fmt.Errorf("%s: two functions could name the flags' variables: %s and %s",
					fset.Position(fn.Pos()), envFunc.Name.Name, fn.Name.Name))
			}
			envFunc = fn
		}
	}

	for _, f := range parsed {
		osPkg := imported(f, "os")
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit: // Config{DatabaseURL: "postgres://…"}: the field's default
				id, ok := n.Type.(*ast.Ident)
				if !ok || fieldVars[id.Name] == nil {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, ok := kv.Key.(*ast.Ident)
					if !ok {
						continue
					}
					name, ok := fieldVars[id.Name][key.Name]
					if !ok || vars[name].HasDefault {
						continue
					}
					v := vars[name]
					v.Default, _ = constOf(kv.Value)
					v.HasDefault = true
					vars[name] = v
				}
			case *ast.CallExpr:
				switch {
				case isCall(n.Fun, osPkg, "Getenv", "LookupEnv") && len(n.Args) == 1:
					name, ok := constOf(n.Args[0])
					if !ok {
						errs = append(errs, fmt.Errorf("%s: os.%s of a name that is not a constant",
							fset.Position(n.Pos()), n.Fun.(*ast.SelectorExpr).Sel.Name))
						return true
					}
					if _, seen := vars[name]; !seen {
						vars[name] = envVar{Name: name, Where: fset.Position(n.Pos()).String()}
					}
				case envFunc != nil:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					isVar, ok := flagFuncs[sel.Sel.Name]
					if !ok {
						return true
					}
					i := 0
					if isVar {
						i = 1
					}
					if len(n.Args) < i+2 {
						return true
					}
					flagName, ok := stringLit(n.Args[i])
					if !ok {
						return true
					}
					name, err := evalEnvFunc(envFunc, consts, flagName)
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: the variable of flag -%s: %w", fset.Position(n.Pos()), flagName, err))
						return true
					}
					v := envVar{Name: name, Where: fset.Position(n.Pos()).String()}
					if sel.Sel.Name != "Func" && sel.Sel.Name != "BoolFunc" && sel.Sel.Name != "Var" {
						v.Default, _ = constOf(n.Args[i+1])
						v.HasDefault = true
					}
					vars[name] = v
				}
			}
			return true
		})
	}
	return vars, errors.Join(errs...)
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

func fieldTag(f *ast.Field) reflect.StructTag {
	if f.Tag == nil {
		return ""
	}
	s, _ := strconv.Unquote(f.Tag.Value)
	return reflect.StructTag(s)
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.SelectorExpr: // a struct of another package of the program: "service.RelayEnv"
		if x, ok := t.X.(*ast.Ident); ok {
			return x.Name + "." + t.Sel.Name
		}
	}
	return ""
}

func isStringToString(fn *ast.FuncDecl) bool {
	p, r := fn.Type.Params.List, fn.Type.Results
	if len(p) != 1 || len(p[0].Names) != 1 || r == nil || len(r.List) != 1 || len(r.List[0].Names) > 1 {
		return false
	}
	pt, ok1 := p[0].Type.(*ast.Ident)
	rt, ok2 := r.List[0].Type.(*ast.Ident)
	return ok1 && ok2 && pt.Name == "string" && rt.Name == "string"
}

// evalEnvFunc evaluates fn(arg) for the small language described at [packageEnv].
func evalEnvFunc(fn *ast.FuncDecl, consts map[string]string, arg string) (string, error) {
	param := fn.Type.Params.List[0].Names[0].Name
	var expr func(ast.Expr) (string, error)
	expr = func(e ast.Expr) (string, error) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if s, ok := stringLit(e); ok {
				return s, nil
			}
		case *ast.Ident:
			if e.Name == param {
				return arg, nil
			}
			if v, ok := consts[e.Name]; ok {
				return v, nil
			}
		case *ast.ParenExpr:
			return expr(e.X)
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				x, err := expr(e.X)
				if err != nil {
					return "", err
				}
				y, err := expr(e.Y)
				return x + y, err
			}
		case *ast.CallExpr:
			sel, ok := e.Fun.(*ast.SelectorExpr)
			if !ok {
				break
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "strings" {
				break
			}
			var args []string
			for _, a := range e.Args {
				if lit, ok := a.(*ast.UnaryExpr); ok && lit.Op == token.SUB { // Replace's n: -1
					args = append(args, "-")
					continue
				}
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.INT {
					args = append(args, lit.Value)
					continue
				}
				s, err := expr(a)
				if err != nil {
					return "", err
				}
				args = append(args, s)
			}
			switch {
			case sel.Sel.Name == "ToUpper" && len(args) == 1:
				return strings.ToUpper(args[0]), nil
			case sel.Sel.Name == "ToLower" && len(args) == 1:
				return strings.ToLower(args[0]), nil
			case sel.Sel.Name == "TrimSpace" && len(args) == 1:
				return strings.TrimSpace(args[0]), nil
			case sel.Sel.Name == "ReplaceAll" && len(args) == 3:
				return strings.ReplaceAll(args[0], args[1], args[2]), nil
			case sel.Sel.Name == "Replace" && len(args) == 4 && args[3] == "-":
				return strings.ReplaceAll(args[0], args[1], args[2]), nil
			}
		}
		return "", fmt.Errorf("cannot evaluate %T in %s", e, fn.Name.Name)
	}
	var block func([]ast.Stmt) (string, bool, error)
	block = func(stmts []ast.Stmt) (string, bool, error) {
		for _, s := range stmts {
			switch s := s.(type) {
			case *ast.ReturnStmt:
				if len(s.Results) != 1 {
					return "", false, fmt.Errorf("a bare return in %s", fn.Name.Name)
				}
				v, err := expr(s.Results[0])
				return v, true, err
			case *ast.IfStmt:
				cond, ok := s.Cond.(*ast.BinaryExpr)
				if s.Init != nil || !ok || (cond.Op != token.EQL && cond.Op != token.NEQ) {
					return "", false, fmt.Errorf("cannot evaluate the if at %v in %s", s.Pos(), fn.Name.Name)
				}
				x, err := expr(cond.X)
				if err != nil {
					return "", false, err
				}
				y, err := expr(cond.Y)
				if err != nil {
					return "", false, err
				}
				var branch []ast.Stmt
				if (x == y) == (cond.Op == token.EQL) {
					branch = s.Body.List
				} else if s.Else != nil {
					els, ok := s.Else.(*ast.BlockStmt)
					if !ok {
						return "", false, fmt.Errorf("cannot evaluate else if in %s", fn.Name.Name)
					}
					branch = els.List
				}
				if v, done, err := block(branch); done || err != nil {
					return v, done, err
				}
			default:
				return "", false, fmt.Errorf("cannot evaluate a %T in %s", s, fn.Name.Name)
			}
		}
		return "", false, nil
	}
	v, done, err := block(fn.Body.List)
	if err == nil && !done {
		err = fmt.Errorf("%s returns nothing for %q", fn.Name.Name, arg)
	}
	return v, err
}

func TestPackageEnv(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		src     string
		want    map[string]envVar
		wantErr string
	}{
		{
			name: "struct tags with defaults and options",
			src: `package app
import "github.com/caarlos0/env/v11"
type Config struct {
	DatabaseURL string ` + "`env:\"ORDERS_DATABASE_URL\" envDefault:\"postgres://postgres@127.0.0.1:5432/orders\"`" + `
	HTTPAddr    string ` + "`env:\"ORDERS_HTTP_ADDR\" envDefault:\":8080\"`" + `
	Token       string ` + "`env:\"ORDERS_TOKEN,required\"`" + `
	Untagged    string
}
func Load() (Config, error) { return env.ParseAs[Config]() }`,
			want: map[string]envVar{
				"ORDERS_DATABASE_URL": {Default: "postgres://postgres@127.0.0.1:5432/orders", HasDefault: true},
				"ORDERS_HTTP_ADDR":    {Default: ":8080", HasDefault: true},
				"ORDERS_TOKEN":        {Required: true},
			},
		},
		{
			name: "defaults from a composite literal",
			src: `package app
type Config struct {
	DatabaseURL string ` + "`env:\"WAREHOUSE_DATABASE_URL\"`" + `
	MaxConns    int    ` + "`env:\"WAREHOUSE_MAX_CONNS\"`" + `
	Failpoints  string ` + "`env:\"CHAOS_FAILPOINTS\"`" + `
}
func DefaultConfig() Config { return Config{DatabaseURL: "postgres://localhost/warehouse", MaxConns: 24} }`,
			want: map[string]envVar{
				"WAREHOUSE_DATABASE_URL": {Default: "postgres://localhost/warehouse", HasDefault: true},
				"WAREHOUSE_MAX_CONNS":    {HasDefault: true},
				"CHAOS_FAILPOINTS":       {},
			},
		},
		{
			name: "options prefix and nested prefixes",
			src: `package loadgen
import cenv "github.com/caarlos0/env/v11"
type DB struct { URL string ` + "`env:\"URL,notEmpty\"`" + ` }
type Config struct {
	Rate float64 ` + "`env:\"RATE\" envDefault:\"5\"`" + `
	DB   DB      ` + "`envPrefix:\"DB_\"`" + `
}
const prefix = "LOADGEN_"
func Load() (c Config, err error) { err = cenv.ParseWithOptions(&c, cenv.Options{Prefix: prefix}); return }`,
			want: map[string]envVar{
				"LOADGEN_RATE":   {Default: "5", HasDefault: true},
				"LOADGEN_DB_URL": {Required: true},
			},
		},
		{
			name: "os.Getenv and os.LookupEnv of constants",
			src: `package failpoint
import "os"
const EnvVar = "CHAOS_FAILPOINTS"
func FromEnv() string { v, _ := os.LookupEnv("OTHER"); return os.Getenv(EnvVar) + v }`,
			want: map[string]envVar{"CHAOS_FAILPOINTS": {}, "OTHER": {}},
		},
		{
			name: "flags named by an env function",
			src: `package main
import ("flag"; "strings"; "time")
func envName(flagName string) string {
	if flagName == "url" {
		return "LOADGEN_ORDERS_URL"
	}
	return "LOADGEN_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
func parse(fs *flag.FlagSet) {
	var url string
	var d time.Duration
	fs.StringVar(&url, "url", "http://127.0.0.1:8080", "the orders API")
	fs.DurationVar(&d, "retry-for", 30*time.Second, "")
	quiet := fs.Bool("quiet", false, "")
	_ = quiet
}`,
			want: map[string]envVar{
				"LOADGEN_ORDERS_URL": {Default: "http://127.0.0.1:8080", HasDefault: true},
				"LOADGEN_RETRY_FOR":  {HasDefault: true},
				"LOADGEN_QUIET":      {HasDefault: true},
			},
		},
		{
			name: "flags without an env function read nothing",
			src: `package main
import "flag"
func main() { flag.Duration("timeout", 0, ""); flag.Parse() }`,
			want: map[string]envVar{},
		},
		{
			name: "a variable name that is not a constant",
			src: `package app
import "os"
func get(name string) string { return os.Getenv("APP_" + name) }`,
			wantErr: "os.Getenv of a name that is not a constant",
		},
		{
			name: "an env function it cannot evaluate",
			src: `package main
import ("flag"; "fmt")
func envName(f string) string { return fmt.Sprintf("X_%s", f) }
func main() { flag.String("rate", "", "") }`,
			wantErr: "the variable of flag -rate: cannot evaluate *ast.CallExpr in envName",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := packageEnv(map[string][]byte{"x.go": []byte(tc.src)})
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			for name, v := range got {
				require.NotEmpty(t, v.Where)
				v.Where = ""
				v.Name = ""
				got[name] = v
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestProgramEnv pins what the real binaries read, so that a change of their configuration
// shows here first.
func TestProgramEnv(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		pkg        string
		reads      []string
		needsValue []string
	}{
		{
			pkg:        "./services/orders/cmd/orders",
			reads:      []string{"ORDERS_DATABASE_URL", "ORDERS_AMQP_URL", "ORDERS_HTTP_ADDR", "ORDERS_RELAY_HTTP_ADDR", "CHAOS_FAILPOINTS"},
			needsValue: []string{"ORDERS_DATABASE_URL", "ORDERS_AMQP_URL"},
		},
		{
			pkg:        "./services/warehouse/cmd/warehouse",
			reads:      []string{"WAREHOUSE_DATABASE_URL", "WAREHOUSE_AMQP_URL", "WAREHOUSE_HTTP_ADDR", "WAREHOUSE_RELAY_HTTP_ADDR", "CHAOS_FAILPOINTS"},
			needsValue: []string{"WAREHOUSE_DATABASE_URL", "WAREHOUSE_AMQP_URL"},
		},
		{
			pkg:        "./loadgen/cmd/loadgen",
			reads:      []string{"LOADGEN_ORDERS_URL", "LOADGEN_RATE", "LOADGEN_CANCEL", "LOADGEN_DUPLICATE", "LOADGEN_UNKNOWN_SKU"},
			needsValue: []string{"LOADGEN_ORDERS_URL"},
		},
		{
			pkg:   "./tools/cmd/alertlog",
			reads: []string{"ALERTLOG_HTTP_ADDR"},
		},
		{
			pkg: "./tools/cmd/healthcheck",
		},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			t.Parallel()
			vars := programEnv(t, tc.pkg)
			for _, name := range tc.reads {
				require.Contains(t, vars, name)
			}
			var needs []string
			for name, v := range vars {
				if v.NeedsValue() {
					needs = append(needs, name)
				}
			}
			require.ElementsMatch(t, tc.needsValue, needs)
		})
	}
}
