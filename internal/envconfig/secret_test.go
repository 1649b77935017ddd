package envconfig_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/envconfig"
)

const secretValue = "s3cr3t-value-never-shown"

type secretConfig struct {
	Token     envconfig.Secret `env:"TEST_TOKEN"`
	TokenFile string           `env:"TEST_TOKEN_FILE"`
}

func TestSecret(t *testing.T) {
	t.Parallel()

	t.Run("ReadsLikeAString", func(t *testing.T) {
		t.Parallel()
		cfg, err := envconfig.Load[secretConfig](map[string]string{"TEST_TOKEN": secretValue})
		require.NoError(t, err)
		require.Equal(t, secretValue, cfg.Token.Reveal())
	})

	t.Run("NeverShown", func(t *testing.T) {
		t.Parallel()
		cfg := secretConfig{Token: secretValue}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "cfg", cfg, "token", cfg.Token)
		slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "cfg", cfg, "token", cfg.Token)
		j, err := json.Marshal(cfg)
		require.NoError(t, err)
		for _, shown := range []string{
			fmt.Sprint(cfg), fmt.Sprintf("%+v %#v %s %q %x %v", cfg, cfg, cfg.Token, cfg.Token, cfg.Token, cfg.Token),
			fmt.Errorf("bad: %v", cfg).Error(), string(j), logs.String(),
		} {
			require.NotContains(t, shown, secretValue)
			require.Contains(t, shown, envconfig.Redacted)
		}
		require.Equal(t, "", envconfig.Secret("").String(), "an unset secret shows as unset")
	})
}

func TestSecretFromFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}

	t.Run("TheValue", func(t *testing.T) {
		t.Parallel()
		s, err := envconfig.SecretFromFile(secretValue, "TEST_TOKEN", "", "TEST_TOKEN_FILE")
		require.NoError(t, err)
		require.Equal(t, secretValue, s.Reveal())
		s, err = envconfig.SecretFromFile("", "TEST_TOKEN", "", "TEST_TOKEN_FILE")
		require.NoError(t, err)
		require.Empty(t, s.Reveal(), "neither set: unset")
	})

	t.Run("TheFileTrailingNewlinesTrimmed", func(t *testing.T) {
		t.Parallel()
		for name, content := range map[string]string{"plain": secretValue, "lf": secretValue + "\n", "crlf": secretValue + "\r\n"} {
			s, err := envconfig.SecretFromFile("", "TEST_TOKEN", write(name, content), "TEST_TOKEN_FILE")
			require.NoError(t, err)
			require.Equal(t, secretValue, s.Reveal(), name)
		}
	})

	t.Run("BothSetIsAnError", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.SecretFromFile(secretValue, "TEST_TOKEN", write("both", secretValue), "TEST_TOKEN_FILE")
		require.EqualError(t, err, "TEST_TOKEN and TEST_TOKEN_FILE are both set: set one of them")
	})

	t.Run("AMissingFileIsAnErrorNamingVariableAndPath", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(dir, "missing")
		_, err := envconfig.SecretFromFile("", "TEST_TOKEN", path, "TEST_TOKEN_FILE")
		require.ErrorIs(t, err, os.ErrNotExist)
		require.Equal(t, "TEST_TOKEN_FILE: cannot read "+path+": no such file or directory", err.Error())
	})

	t.Run("AnEmptyFileIsAnError", func(t *testing.T) {
		t.Parallel()
		for _, content := range []string{"", "\n", "\r\n\n"} {
			path := write("empty", content)
			_, err := envconfig.SecretFromFile("", "TEST_TOKEN", path, "TEST_TOKEN_FILE")
			require.EqualError(t, err, "TEST_TOKEN_FILE: "+path+" is empty")
		}
	})

	t.Run("AnUnreadableFileNamesNoContent", func(t *testing.T) {
		t.Parallel()
		_, err := envconfig.SecretFromFile("", "TEST_TOKEN", dir, "TEST_TOKEN_FILE") // a directory
		require.ErrorContains(t, err, "TEST_TOKEN_FILE: cannot read "+dir)
	})
}
