package envconfig_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/envconfig"
)

type config struct {
	Addr     string        `env:"TEST_ADDR" envDefault:":8080"`
	Interval time.Duration `env:"TEST_INTERVAL" envDefault:"1s"`
	Batch    int           `env:"TEST_BATCH" envDefault:"100"`
}

func (c config) Validate() error {
	var v envconfig.Checks
	v.Check(c.Batch > 0, "TEST_BATCH must be positive, is %d", c.Batch)
	v.Check(c.Interval > 0, "TEST_INTERVAL must be positive, is %s", c.Interval)
	return v.Err()
}

func TestLoad(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, config{Addr: ":8080", Interval: time.Second, Batch: 100}, envconfig.Defaults[config]())
	})

	t.Run("SetVariablesOverride", func(t *testing.T) {
		t.Parallel()
		cfg, err := envconfig.Load[config](map[string]string{"TEST_ADDR": ":1234", "TEST_INTERVAL": "250ms", "ADDR": ":9"})
		require.NoError(t, err)
		require.Equal(t, config{Addr: ":1234", Interval: 250 * time.Millisecond, Batch: 100}, cfg)
	})

	t.Run("AnEmptyVariableIsUnset", func(t *testing.T) {
		t.Parallel()
		cfg, err := envconfig.Load[config](map[string]string{"TEST_ADDR": ""})
		require.NoError(t, err)
		require.Equal(t, ":8080", cfg.Addr)
	})

	t.Run("ParseErrorsNameTheVariable", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.Load[config](map[string]string{"TEST_INTERVAL": "soon", "TEST_BATCH": "many"})
		require.ErrorContains(t, err, "TEST_INTERVAL: ")
		require.ErrorContains(t, err, `invalid duration "soon"`)
		require.ErrorContains(t, err, "TEST_BATCH: ")
		require.NotContains(t, err.Error(), "Interval")
	})
}

func TestLoadFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	addr := write("addr", ":4321\n")

	t.Run("AVariableIsTheContentOfTheFileItsFILEVariableNames", func(t *testing.T) {
		t.Parallel()
		environ := map[string]string{"TEST_ADDR_FILE": addr, "TEST_BATCH_FILE": write("batch", "7\r\n")}
		cfg, err := envconfig.Load[config](environ)
		require.NoError(t, err)
		require.Equal(t, config{Addr: ":4321", Interval: time.Second, Batch: 7}, cfg, "trailing newlines trimmed")
		require.Equal(t, map[string]string{"TEST_ADDR_FILE": addr, "TEST_BATCH_FILE": filepath.Join(dir, "batch")}, environ,
			"the caller's map is left as it was")
	})

	t.Run("BothWaysIsAnError", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.Load[config](map[string]string{"TEST_ADDR": ":1", "TEST_ADDR_FILE": addr})
		require.ErrorContains(t, err, "TEST_ADDR and TEST_ADDR_FILE are both set")
	})

	t.Run("AFileThatCannotBeReadOrIsEmptyIsAnErrorThatNamesItNotItsContent", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(dir, "missing")
		_, err := envconfig.Load[config](map[string]string{"TEST_ADDR_FILE": missing, "TEST_BATCH_FILE": write("empty", "\n")})
		require.ErrorContains(t, err, "TEST_ADDR_FILE: cannot read "+missing)
		require.ErrorContains(t, err, "TEST_BATCH_FILE: "+filepath.Join(dir, "empty")+" is empty")
	})

	t.Run("ContentThatDoesNotParseNamesTheVariable", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.Load[config](map[string]string{"TEST_BATCH_FILE": write("many", "many")})
		require.ErrorContains(t, err, "TEST_BATCH: ")
	})

	t.Run("ASettingThatReadsItsOwnFileIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		type withFile struct {
			Token     string `env:"TEST_TOKEN"`
			TokenFile string `env:"TEST_TOKEN_FILE"`
		}
		cfg, err := envconfig.Load[withFile](map[string]string{"TEST_TOKEN_FILE": addr})
		require.NoError(t, err)
		require.Equal(t, withFile{TokenFile: addr}, cfg)
	})
}

func TestLoadProcessEnvironment(t *testing.T) { // not parallel: it sets a variable
	t.Setenv("TEST_BATCH", "7")
	cfg, err := envconfig.Load[config](nil)
	require.NoError(t, err)
	require.Equal(t, 7, cfg.Batch)
}

func TestLoadValid(t *testing.T) {
	t.Parallel()
	cfg, err := envconfig.LoadValid[config](map[string]string{"TEST_BATCH": "3"})
	require.NoError(t, err)
	require.Equal(t, 3, cfg.Batch)
	_, err = envconfig.LoadValid[config](map[string]string{"TEST_BATCH": "0"})
	require.ErrorContains(t, err, "TEST_BATCH must be positive, is 0")
	_, err = envconfig.LoadValid[config](map[string]string{"TEST_BATCH": "x"})
	require.ErrorContains(t, err, "TEST_BATCH: ")
}

func TestChecks(t *testing.T) {
	t.Parallel()
	require.NoError(t, envconfig.Defaults[config]().Validate())
	err := config{Batch: 0, Interval: -time.Second}.Validate()
	require.ErrorContains(t, err, "invalid configuration")
	require.ErrorContains(t, err, "TEST_BATCH must be positive, is 0")
	require.ErrorContains(t, err, "TEST_INTERVAL must be positive, is -1s")
}

func TestSection(t *testing.T) {
	t.Parallel()
	type part struct {
		Size     int
		Interval time.Duration
	}
	flat := struct {
		PartSize     int
		PartInterval time.Duration
		Other        string
	}{PartSize: 3, PartInterval: time.Second, Other: "x"}
	require.Equal(t, part{Size: 3, Interval: time.Second}, envconfig.Section[part](flat, "Part"))
	require.Equal(t, part{Size: 3, Interval: time.Second}, envconfig.Section[part](&flat, "Part"))
	require.PanicsWithValue(t, "envconfig: struct { PartSize int; PartInterval time.Duration; Other string } has no field OtherSize of type int",
		func() { envconfig.Section[part](flat, "Other") })
}

// Shared are settings two configurations have, without their prefix.
type Shared struct {
	SharedBatch   int           `env:"SHARED_BATCH" envDefault:"10"`
	SharedTimeout time.Duration `env:"SHARED_TIMEOUT" envDefault:"2s"`
}

type prefixed struct {
	Addr   string `env:"ONE_ADDR" envDefault:":1"`
	Shared `env:"ONE_"`
}

func TestEmbeddedSettings(t *testing.T) {
	t.Parallel()

	t.Run("DefaultsAndPromotedFields", func(t *testing.T) {
		t.Parallel()
		cfg := envconfig.Defaults[prefixed]()
		require.Equal(t, 10, cfg.SharedBatch)
		require.Equal(t, 2*time.Second, cfg.SharedTimeout)
	})

	t.Run("ReadUnderThePrefix", func(t *testing.T) {
		t.Parallel()
		cfg, err := envconfig.Load[prefixed](map[string]string{"ONE_SHARED_BATCH": "7", "SHARED_TIMEOUT": "9s"})
		require.NoError(t, err)
		require.Equal(t, 7, cfg.SharedBatch)
		require.Equal(t, 2*time.Second, cfg.SharedTimeout, "the unprefixed variable is not this configuration's")
	})

	t.Run("ParseErrorsNameThePrefixedVariable", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.Load[prefixed](map[string]string{"ONE_SHARED_TIMEOUT": "soon"})
		require.ErrorContains(t, err, "ONE_SHARED_TIMEOUT: ")
		require.NotContains(t, err.Error(), "SharedTimeout")
	})

	t.Run("Variables", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []string{"ONE_ADDR", "ONE_SHARED_BATCH", "ONE_SHARED_TIMEOUT"}, envconfig.Variables[prefixed]())
		require.Equal(t, []string{"TEST_ADDR", "TEST_INTERVAL", "TEST_BATCH"}, envconfig.Variables[config]())
	})
}
