package redact_test

import (
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/redact"
)

func TestURLError(t *testing.T) {
	t.Parallel()
	const password = "S3cr3t-pw"
	for _, tc := range []struct {
		url, want string
	}{
		// The password not percent-encoded: its / ends the host, whose port it becomes.
		{"amqp://shop:" + password + "/x@mq:5672/", "invalid port after host"},
		{"postgres://shop:" + password + "%zz@db:5432/shop", "invalid URL escape"},
		{"amqp://shop:" + password + "@mq:56x72/", "invalid port after host"},
	} {
		_, err := url.Parse(tc.url)
		require.Error(t, err)
		got := redact.URLError(err).Error()
		require.NotContains(t, got, password)
		require.Contains(t, got, tc.want)

		_, err = amqp.ParseURI(tc.url)
		require.Error(t, err)
		got = redact.URLError(err).Error()
		require.NotContains(t, got, password)
		require.Contains(t, got, tc.want)
	}
	require.NoError(t, redact.URLError(nil))
}

func TestText(t *testing.T) {
	t.Parallel()
	const password = "S3cr3t/p@ss:w%rd"
	u := "amqp://" + url.UserPassword("shop", password).String() + "@mq:5672/"
	text := "dial " + u + ": refused; password " + password + ", encoded " + url.QueryEscape(password) + " and " + url.PathEscape(password)
	got := redact.Text(text, u, password)
	require.NotContains(t, got, "S3cr3t")
	require.Equal(t, 3, strings.Count(got, redact.Placeholder), got)
	require.Contains(t, got, "dial <URL>: refused")
}
