package walstream

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParseConfigTLS: with a TLS config, every host of the URL gets TLS (never the
// plain attempt sslmode=prefer, allow or disable would make), checked for its own name;
// a Unix socket gets none (servers speak no TLS there); direct TLS gets the ALPN the server
// requires.
func TestParseConfigTLS(t *testing.T) {
	t.Parallel()
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	for _, tc := range []struct {
		url   string
		hosts []string // every attempt, in order
		plain []string // the attempts without TLS
		alpn  bool
	}{
		{url: "postgres://u@h1:5432,h2:5433/db?sslmode=prefer&target_session_attrs=read-write", hosts: []string{"h1", "h2"}},
		{url: "postgres://u@h1,h2/db?sslmode=allow", hosts: []string{"h1", "h2"}},
		{url: "postgres://u@h1,h2/db?sslmode=disable", hosts: []string{"h1", "h2"}},
		{url: "postgres://u@/db?host=/var/run/postgresql,h2", hosts: []string{"/var/run/postgresql", "h2"}, plain: []string{"/var/run/postgresql"}},
		{url: "postgres://u@h1/db?sslmode=require&sslnegotiation=direct", hosts: []string{"h1"}, alpn: true},
	} {
		t.Run(tc.url, func(t *testing.T) {
			c, err := parseConfig(Config{URL: tc.url, TLSConfig: conf})
			require.NoError(t, err)
			type attempt struct {
				host string
				tls  *tls.Config
			}
			all := []attempt{{c.Host, c.TLSConfig}}
			for _, f := range c.Fallbacks {
				all = append(all, attempt{f.Host, f.TLSConfig})
			}
			var hosts, plain []string
			for _, a := range all {
				hosts = append(hosts, a.host)
				if a.tls == nil {
					plain = append(plain, a.host)
					continue
				}
				require.Equal(t, a.host, a.tls.ServerName)
				require.Equal(t, tc.alpn, len(a.tls.NextProtos) > 0)
			}
			require.Equal(t, tc.hosts, hosts)
			require.Equal(t, tc.plain, plain)
			require.Empty(t, conf.ServerName, "the caller's config is never written")
		})
	}
}

// TestParseConfigConnectTimeout: each connection attempt is bounded (a host cut off by the
// network answers nothing), by the URL's connect_timeout when it sets one.
func TestParseConfigConnectTimeout(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(Config{URL: "postgres://u@h1,h2/db?sslmode=disable"})
	require.NoError(t, err)
	require.Equal(t, DefaultConnectTimeout, c.ConnectTimeout)
	c, err = parseConfig(Config{URL: "postgres://u@h1,h2/db?sslmode=disable&connect_timeout=3"})
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, c.ConnectTimeout)
}
