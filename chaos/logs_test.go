package chaos

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLastOrderBeforeCrash(t *testing.T) {
	t.Parallel()
	logs := `### chaos: orders-api incarnation 1 started 2026-11-29T10:00:00Z failpoints="api.after-commit=kill@3"
{"time":"…","level":"INFO","msg":"order created","order_id":"o-1"}
{"time":"…","level":"INFO","msg":"request","status":201}
{"time":"…","level":"INFO","msg":"order created","order_id":"o-2"}
### chaos: orders-api incarnation 1 ended 2026-11-29T10:00:02Z: killed by its crash point api.after-commit (signal: killed); restarting in 500ms
### chaos: orders-api incarnation 2 started 2026-11-29T10:00:03Z failpoints=""
{"time":"…","level":"INFO","msg":"order created","order_id":"o-3"}
`
	require.Equal(t, "o-2", lastOrderBeforeCrash(logs))
	require.Equal(t, "", lastOrderBeforeCrash(""))
}

func TestCountLines(t *testing.T) {
	t.Parallel()
	logs := `{"msg":"duplicate message skipped","message_id":"a"}
{"msg":"message processed"}
{"msg":"duplicate message skipped","message_id":"b"}`
	require.Equal(t, 2, countLines(logs, logDuplicateSkipped))
	require.Equal(t, 0, countLines("", logDuplicateSkipped))
}

func TestFormatCodes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "no answer×2, 200×1, 503×7", formatCodes(map[int]int{503: 7, 0: 2, 200: 1}))
	require.Equal(t, "none", formatErrors(nil))
	require.Equal(t, "connection×1, http_5xx×2", formatErrors(map[string]int{"http_5xx": 2, "connection": 1}))
}

func TestPrefixWriter(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	w := prefixWriter{w: &b, prefix: "> "}
	n, err := w.Write([]byte("\rplaced 1\rplaced 2\n\n"))
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.Equal(t, "> placed 1\n> placed 2\n", b.String())
}
