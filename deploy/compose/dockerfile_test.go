package compose_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"go/version"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/buildkit/frontend/dockerui"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	digest "github.com/opencontainers/go-digest"
	ocispecs "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
)

type dockerfile struct {
	raw      []byte
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
}

var theDockerfile = sync.OnceValues(func() (*dockerfile, error) {
	raw, err := os.ReadFile(repoPath("Dockerfile"))
	if err != nil {
		return nil, err
	}
	res, err := parser.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, err
	}
	// RUN --mount values are parsed when expanded; none of ours uses a variable.
	for _, s := range stages {
		for _, c := range s.Commands {
			if run, ok := c.(*instructions.RunCommand); ok {
				if err := run.Expand(func(word string) (string, error) { return word, nil }); err != nil {
					return nil, err
				}
			}
		}
	}
	return &dockerfile{raw: raw, stages: stages, metaArgs: metaArgs}, nil
})

func parseDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	df, err := theDockerfile()
	require.NoError(t, err, "parse Dockerfile")
	require.NotEmpty(t, df.stages)
	return df
}

func (df *dockerfile) final() instructions.Stage { return df.stages[len(df.stages)-1] }

// buildStage is the stage the final one copies the binaries from.
func (df *dockerfile) buildStage(t *testing.T) instructions.Stage {
	t.Helper()
	for _, c := range df.final().Commands {
		if cp, ok := c.(*instructions.CopyCommand); ok && cp.From != "" {
			for _, s := range df.stages {
				if strings.EqualFold(s.Name, cp.From) {
					return s
				}
			}
		}
	}
	t.Fatal("the final stage copies from no stage of the Dockerfile")
	return instructions.Stage{}
}

func dockerignore(t *testing.T) *patternmatcher.PatternMatcher {
	t.Helper()
	f, err := os.Open(repoPath(".dockerignore"))
	require.NoError(t, err)
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	return pm
}

// contextFiles lists the files of the build context (repository root less .dockerignore),
// slash-separated and relative to the root.
func contextFiles(t *testing.T) []string {
	t.Helper()
	pm := dockerignore(t)
	var files []string
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if excluded && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		if !excluded && d.Type().IsRegular() {
			files = append(files, rel)
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// builtPackages are the values of the build argument PKG in the compose file.
func builtPackages(t *testing.T) []string {
	t.Helper()
	var pkgs []string
	for _, svc := range project(t).Services {
		if svc.Build != nil && svc.Build.Args["PKG"] != nil && !slices.Contains(pkgs, *svc.Build.Args["PKG"]) {
			pkgs = append(pkgs, *svc.Build.Args["PKG"])
		}
	}
	slices.Sort(pkgs)
	return pkgs
}

// goWorkModules are the folders go.work uses, slash-separated, without "./".
func goWorkModules(t *testing.T) (goVersion string, dirs []string) {
	t.Helper()
	b, err := os.ReadFile(repoPath("go.work"))
	require.NoError(t, err)
	wf, err := modfile.ParseWork("go.work", b, nil)
	require.NoError(t, err)
	for _, u := range wf.Use {
		dirs = append(dirs, path.Clean(u.Path))
	}
	return wf.Go.Version, dirs
}

// fakeResolver answers BuildKit's questions about base images without a registry: every image
// is a linux image of the build machine's architecture.
type fakeResolver struct{}

func (fakeResolver) ResolveImageConfig(_ context.Context, ref string, opt sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	img := ocispecs.Image{Platform: ocispecs.Platform{OS: "linux", Architecture: runtime.GOARCH}}
	if opt.ImageOpt != nil && opt.ImageOpt.Platform != nil {
		img.Platform = *opt.ImageOpt.Platform
	}
	img.Config.Env = []string{"PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	dt, err := json.Marshal(img)
	return ref, digest.FromBytes(dt), dt, err
}

// argEnv is an EnvGetter of ARG values.
type argEnv map[string]string

func (e argEnv) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e argEnv) Keys() []string              { return slices.Collect(maps.Keys(e)) }

func TestDockerfile(t *testing.T) {
	t.Parallel()

	t.Run("BuildKit's linter finds nothing for any binary", func(t *testing.T) {
		t.Parallel()
		df := parseDockerfile(t)
		for _, pkg := range builtPackages(t) {
			sm := llb.NewSourceMap(nil, "Dockerfile", "Dockerfile", df.raw)
			sm.Definition = &llb.Definition{}
			res, err := dockerfile2llb.DockerfileLint(t.Context(), df.raw, dockerfile2llb.ConvertOpt{
				Config:       dockerui.Config{BuildArgs: map[string]string{"PKG": pkg}},
				MetaResolver: fakeResolver{},
				SourceMap:    sm,
			})
			require.NoError(t, err)
			require.Nil(t, res.Error, "PKG=%s", pkg)
			for _, w := range res.Warnings {
				t.Errorf("PKG=%s: %s: %s (line %v) %s", pkg, w.RuleName, w.Detail, w.Location.Ranges, w.URL)
			}
		}
	})

	t.Run("every FROM is pinned to a version", func(t *testing.T) {
		t.Parallel()
		df := parseDockerfile(t)
		args := argEnv{}
		for _, a := range df.metaArgs {
			for _, kv := range a.Args {
				if kv.Value != nil {
					args[kv.Key] = *kv.Value
				}
			}
		}
		lex := shell.NewLex(parser.DefaultEscapeToken)
		var earlier []string
		for _, s := range df.stages {
			base, _, err := lex.ProcessWord(s.BaseName, args)
			require.NoError(t, err)
			if !slices.Contains(earlier, strings.ToLower(base)) && base != "scratch" {
				require.NoError(t, pinned(base), "FROM %s", s.BaseName)
			}
			require.Contains(t, []string{"", "$BUILDPLATFORM", "${BUILDPLATFORM}"}, s.Platform, "FROM --platform of %s", s.BaseName)
			earlier = append(earlier, strings.ToLower(s.Name))
		}
	})

	t.Run("the Go image is at least go.work's Go", func(t *testing.T) {
		t.Parallel()
		goVersion, _ := goWorkModules(t)
		var found bool
		for _, s := range parseDockerfile(t).stages {
			if imageRepo(s.BaseName) != "golang" {
				continue
			}
			found = true
			_, tag, _ := strings.Cut(s.BaseName, ":")
			v, _, _ := strings.Cut(tag, "-")
			require.True(t, version.IsValid("go"+v), "golang tag %q", tag)
			require.GreaterOrEqual(t, version.Compare("go"+v, "go"+goVersion), 0, "golang:%s builds a go %s workspace", tag, goVersion)
		}
		require.True(t, found, "no golang stage")
	})

	t.Run("the runtime stage runs /app as non-root and holds /healthcheck", func(t *testing.T) {
		t.Parallel()
		df := parseDockerfile(t)
		final := df.final()
		var user string
		var entrypoint *instructions.EntrypointCommand
		var copied []string
		for _, c := range final.Commands {
			switch c := c.(type) {
			case *instructions.UserCommand:
				user = c.User
			case *instructions.EntrypointCommand:
				entrypoint = c
			case *instructions.CopyCommand:
				require.NotEmpty(t, c.From, "the runtime stage copies only from the build stage: %s", c.String())
				copied = append(copied, c.DestPath)
			case *instructions.RunCommand:
				t.Errorf("the runtime stage has no shell to RUN %s", c.String())
			}
		}
		name, group, _ := strings.Cut(user, ":")
		require.NotContains(t, []string{"", "root", "0"}, name, "USER of the final stage")
		require.NotContains(t, []string{"root", "0"}, group, "USER of the final stage")
		require.NotNil(t, entrypoint)
		require.False(t, entrypoint.PrependShell, "ENTRYPOINT in exec form")
		require.Equal(t, []string{"/app"}, entrypoint.CmdLine)
		require.ElementsMatch(t, []string{"/app", "/healthcheck"}, copied)
	})

	t.Run("every module's go.mod and go.sum are copied before go mod download, with a module cache", func(t *testing.T) {
		t.Parallel()
		df := parseDockerfile(t)
		_, modules := goWorkModules(t)
		want := []string{"go.work", "go.work.sum"}
		for _, m := range modules {
			want = append(want, m+"/go.mod", m+"/go.sum")
		}
		var before []string
		var download *instructions.RunCommand
		var sourcesAfter bool
		for _, c := range df.buildStage(t).Commands {
			switch c := c.(type) {
			case *instructions.CopyCommand:
				if c.From != "" {
					continue
				}
				if download == nil {
					for _, src := range c.SourcePaths {
						before = append(before, path.Clean(src))
					}
				} else if slices.Contains(c.SourcePaths, ".") {
					sourcesAfter = true
				}
			case *instructions.RunCommand:
				if download == nil && strings.Contains(strings.Join(c.CmdLine, " "), "go mod download") {
					download = c
				}
			}
		}
		require.NotNil(t, download, "no RUN go mod download")
		require.ElementsMatch(t, want, before,
			"the COPY lines before go mod download must be go.work, go.work.sum and the go.mod and go.sum of every module of go.work")
		require.Contains(t, cacheTargets(download), "/go/pkg/mod", "go mod download with --mount=type=cache,target=/go/pkg/mod")
		require.True(t, sourcesAfter, "COPY . . after go mod download")
	})

	t.Run("go build of every binary from the build context", func(t *testing.T) {
		t.Parallel()
		builds := replayBuildStage(t, parseDockerfile(t))
		pkgs := builtPackages(t)
		require.NotEmpty(t, pkgs)

		// Every go build of the stage, for every PKG the compose file builds; the same
		// command twice (healthcheck) once.
		type job struct {
			name  string
			build goBuild
			argv  []string
			env   []string
		}
		jobs := map[string]job{}
		for _, pkg := range pkgs {
			for _, b := range builds {
				argv, env := b.command(t, map[string]string{"PKG": pkg, "TARGETOS": "linux", "TARGETARCH": runtime.GOARCH})
				key := strings.Join(append(env, argv...), " ")
				if _, ok := jobs[key]; ok {
					continue
				}
				name := argv[len(argv)-1]
				jobs[key] = job{name: name, build: b, argv: argv, env: env}
			}
		}
		var names []string
		for _, j := range jobs {
			names = append(names, j.name)
		}
		want := []string{"./tools/cmd/healthcheck"}
		want = append(want, pkgs...)
		require.ElementsMatch(t, want, names, "go build runs for the healthcheck and for every PKG")

		for _, j := range jobs {
			t.Run(j.name, func(t *testing.T) {
				t.Parallel()
				require.Contains(t, j.env, "CGO_ENABLED=0")
				require.Contains(t, j.env, "GOOS=linux")
				require.Contains(t, j.argv, "-trimpath")
				require.Contains(t, j.argv, "-ldflags=-s -w")
				require.Contains(t, cacheTargets(j.build.run), "/go/pkg/mod", "go build with the module cache that go mod download filled")

				out := filepath.Join(t.TempDir(), "bin")
				argv := slices.Clone(j.argv)
				i := slices.Index(argv, "-o")
				require.Positive(t, i, "go build -o")
				argv[i+1] = out

				cmd := exec.CommandContext(t.Context(), argv[0], argv[1:]...)
				cmd.Dir = j.build.dir
				cmd.Env = append(goBuildEnv(), j.env...)
				output, err := cmd.CombinedOutput()
				require.NoError(t, err, "in %s: %s %s\n%s", j.build.dir, strings.Join(j.env, " "), strings.Join(argv, " "), output)

				f, err := elf.Open(out)
				require.NoError(t, err)
				defer f.Close()
				for _, prog := range f.Progs {
					require.NotEqual(t, elf.PT_INTERP, prog.Type, "%s is not a static binary", j.name)
				}
				libs, err := f.ImportedLibraries()
				require.NoError(t, err)
				require.Empty(t, libs, "%s links shared libraries", j.name)
			})
		}
	})
}

// goBuildEnv is this process's environment as the golang image would have it: no GOFLAGS or
// GOWORK of the developer's, the local toolchain.
func goBuildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOFLAGS", "GOWORK", "CGO_ENABLED", "GOOS", "GOARCH", "GOTOOLCHAIN":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOTOOLCHAIN=local")
}

func cacheTargets(run *instructions.RunCommand) []string {
	var targets []string
	for _, m := range instructions.GetMounts(run) {
		if m.Type == instructions.MountTypeCache {
			targets = append(targets, m.Target)
		}
	}
	return targets
}

// goBuild is a RUN of the build stage that runs go build, with the state it runs in.
type goBuild struct {
	run  *instructions.RunCommand
	dir  string            // its working directory, in the replayed file system
	args map[string]string // the ARGs in scope, with their defaults
	env  []string          // ENV of the stage
}

// command returns the go build command line of b and the variables its shell line sets, with
// args (build arguments) over the ARG defaults.
func (b goBuild) command(t *testing.T, args map[string]string) (argv, env []string) {
	t.Helper()
	scope := argEnv{}
	for k, v := range b.args {
		scope[k] = v
		if a, ok := args[k]; ok {
			scope[k] = a
		}
	}
	lex := shell.NewLex(parser.DefaultEscapeToken)
	for _, segment := range splitShell(strings.Join(b.run.CmdLine, " ")) {
		words, err := lex.ProcessWords(segment, scope)
		require.NoError(t, err, "RUN %s", segment)
		var assign []string
		for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
			assign = append(assign, words[0])
			words = words[1:]
		}
		if len(words) >= 2 && words[0] == "go" && words[1] == "build" {
			return words, append(slices.Clone(b.env), assign...)
		}
	}
	t.Fatalf("no go build in RUN %s", b.run.CmdLine)
	return nil, nil
}

// splitShell splits a shell line at &&, || and ; outside quotes.
func splitShell(line string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	for i := 0; i < len(line); i++ {
		c := rune(line[i])
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ';' || (c == '&' || c == '|') && i+1 < len(line) && rune(line[i+1]) == c:
			out = append(out, cur.String())
			cur.Reset()
			if c != ';' {
				i++
			}
			continue
		}
		cur.WriteRune(c)
	}
	return append(out, cur.String())
}

// replayBuildStage replays the build stage's WORKDIR, ARG, ENV and COPY instructions on a
// temporary file system, with the build context as .dockerignore leaves it, and returns its
// go build RUNs with the state they run in. At the RUN of go mod download it checks that
// the workspace loads from what has been copied so far.
func replayBuildStage(t *testing.T, df *dockerfile) []goBuild {
	t.Helper()
	root := t.TempDir()
	files := contextFiles(t)
	workdir := "/"
	args := map[string]string{}
	var env []string
	var builds []goBuild
	host := func(p string) string { return filepath.Join(root, filepath.FromSlash(p)) }

	for _, c := range df.buildStage(t).Commands {
		switch c := c.(type) {
		case *instructions.WorkdirCommand:
			workdir = path.Join(workdir, c.Path)
			if path.IsAbs(c.Path) {
				workdir = path.Clean(c.Path)
			}
			require.NoError(t, os.MkdirAll(host(workdir), 0o755))
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				args[kv.Key] = ""
				if kv.Value != nil {
					args[kv.Key] = *kv.Value
				}
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		case *instructions.CopyCommand:
			if c.From != "" {
				continue
			}
			dest := c.DestPath
			if !path.IsAbs(dest) {
				dest = path.Join(workdir, dest)
			}
			intoDir := strings.HasSuffix(c.DestPath, "/") || c.DestPath == "." || len(c.SourcePaths) > 1
			for _, src := range c.SourcePaths {
				src = path.Clean(src)
				var matched int
				for _, f := range files {
					var to string
					switch {
					case src == ".":
						to = path.Join(dest, f)
					case f == src:
						to = dest
						if intoDir {
							to = path.Join(dest, path.Base(f))
						}
					case strings.HasPrefix(f, src+"/"):
						to = path.Join(dest, strings.TrimPrefix(f, src+"/"))
					default:
						if ok, _ := path.Match(src, f); ok {
							to = path.Join(dest, path.Base(f))
						} else {
							continue
						}
					}
					matched++
					b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(f)))
					require.NoError(t, err)
					require.NoError(t, os.MkdirAll(filepath.Dir(host(to)), 0o755))
					require.NoError(t, os.WriteFile(host(to), b, 0o644))
				}
				require.Positive(t, matched, "COPY %s: not in the build context (missing, or excluded by .dockerignore)", src)
			}
		case *instructions.RunCommand:
			line := strings.Join(c.CmdLine, " ")
			if strings.Contains(line, "go mod download") {
				// go mod download fetches; go list -m all only needs what the download
				// needs: a workspace whose every module's go.mod is there.
				cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "all")
				cmd.Dir = host(workdir)
				cmd.Env = goBuildEnv()
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "the workspace does not load from what is copied before go mod download:\n%s", out)
			}
			if strings.Contains(line, "go build") {
				builds = append(builds, goBuild{run: c, dir: host(workdir), args: maps.Clone(args), env: slices.Clone(env)})
			}
		}
	}
	require.NotEmpty(t, builds, "no go build in the build stage")
	return builds
}

func TestSplitShell(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		`go build -o /out/app "$PKG"`: {`go build -o /out/app "$PKG"`},
		`a && b`:                      {`a `, ` b`},
		`a; b || c`:                   {`a`, ` b `, ` c`},
		`go build -ldflags="-s -w && x" -o /out/a .`: {`go build -ldflags="-s -w && x" -o /out/a .`},
		`echo 'a;b' && c`: {`echo 'a;b' `, ` c`},
	} {
		t.Run(line, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, want, splitShell(line))
		})
	}
}

func TestDockerfileFixtures(t *testing.T) {
	t.Parallel()
	// The checks above catch these mistakes; BuildKit's linter catches the rest.
	for _, tc := range []struct {
		name, dockerfile string
		wantRule         string
	}{
		{
			name:       "a secret in ENV",
			dockerfile: "FROM golang:1.26.8 AS build\nENV DB_PASSWORD=secret\nFROM scratch\nCOPY --from=build /x /x\n",
			wantRule:   "SecretsUsedInArgOrEnv",
		},
		{
			name:       "a shell-form ENTRYPOINT",
			dockerfile: "FROM golang:1.26.8 AS build\nFROM scratch\nCOPY --from=build /x /x\nENTRYPOINT /x\n",
			wantRule:   "JSONArgsRecommended",
		},
		{
			name:       "a constant platform",
			dockerfile: "FROM --platform=linux/amd64 golang:1.26.8 AS build\nFROM scratch\nCOPY --from=build /x /x\n",
			wantRule:   "FromPlatformFlagConstDisallowed",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dt := []byte(tc.dockerfile)
			sm := llb.NewSourceMap(nil, "Dockerfile", "Dockerfile", dt)
			sm.Definition = &llb.Definition{}
			res, err := dockerfile2llb.DockerfileLint(t.Context(), dt, dockerfile2llb.ConvertOpt{MetaResolver: fakeResolver{}, SourceMap: sm})
			require.NoError(t, err)
			var rules []string
			for _, w := range res.Warnings {
				rules = append(rules, w.RuleName)
			}
			require.Contains(t, rules, tc.wantRule, fmt.Sprintf("%+v", res.Warnings))
		})
	}
}
