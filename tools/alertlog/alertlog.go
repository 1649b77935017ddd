// Package alertlog is the webhook receiver of the outboxshop compose stack: Alertmanager posts
// its notifications to it (deploy/alertmanager/alertmanager.yml: POST /page, POST /ticket) and
// it logs every alert of every notification as one JSON line on stdout, so that
// `docker compose logs -f alert-logger` shows what would have paged or opened a ticket.
//
// A line looks like
//
//	{"time":"…","level":"WARN","msg":"alert","service":"alert-logger","receiver":"page",
//	 "status":"firing","alertname":"OutboxRelayStalled","severity":"page","job":"orders-relay",
//	 "summary":"…","starts_at":"…","labels":{…},"annotations":{…},"fingerprint":"…","group_key":"…"}
//
// at WARN while firing, INFO once resolved. Replace it with a pager or a chat in a real
// deployment.
package alertlog

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// Config is the receiver's configuration, read from the environment by the command.
type Config struct {
	// HTTPAddr is where it listens for webhooks (any path: the path names the receiver) and
	// serves GET /healthz.
	HTTPAddr string `env:"ALERTLOG_HTTP_ADDR" envDefault:":8080"`
}

// MaxBodyBytes bounds a notification; Alertmanager's are far smaller.
const MaxBodyBytes = 1 << 20

// Notification is Alertmanager's webhook body (version 4).
type Notification struct {
	Version           string            `json:"version"`
	GroupKey          string            `json:"groupKey"`
	TruncatedAlerts   int               `json:"truncatedAlerts"`
	Status            string            `json:"status"`
	Receiver          string            `json:"receiver"`
	GroupLabels       map[string]string `json:"groupLabels"`
	CommonLabels      map[string]string `json:"commonLabels"`
	CommonAnnotations map[string]string `json:"commonAnnotations"`
	ExternalURL       string            `json:"externalURL"`
	Alerts            []Alert           `json:"alerts"`
}

// Alert is one alert of a [Notification].
type Alert struct {
	Status       string            `json:"status"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL"`
	Fingerprint  string            `json:"fingerprint"`
}

// Handler logs the alerts of every notification POSTed to it and answers 200; it answers 400
// to a body that is not a notification and 405 to other methods. GET /healthz answers 200.
func Handler(log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var n Notification
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		if err := dec.Decode(&n); err != nil {
			log.WarnContext(r.Context(), "notification refused", "path", r.URL.Path, "error", err.Error())
			http.Error(w, "not an Alertmanager notification: "+err.Error(), http.StatusBadRequest)
			return
		}
		// The path is the receiver in alertmanager.yml's URLs; the body names it too.
		receiver := cmp.Or(n.Receiver, strings.Trim(r.URL.Path, "/"))
		for _, a := range n.Alerts {
			level := slog.LevelInfo
			if a.Status == "firing" {
				level = slog.LevelWarn
			}
			attrs := []slog.Attr{
				slog.String("receiver", receiver),
				slog.String("path", r.URL.Path),
				slog.String("status", a.Status),
				slog.String("alertname", a.Labels["alertname"]),
				slog.String("severity", a.Labels["severity"]),
				slog.String("job", a.Labels["job"]),
				slog.String("summary", a.Annotations["summary"]),
				slog.Time("starts_at", a.StartsAt),
				slog.Any("labels", a.Labels),
				slog.Any("annotations", a.Annotations),
				slog.String("fingerprint", a.Fingerprint),
				slog.String("group_key", n.GroupKey),
			}
			if a.Status == "resolved" {
				attrs = append(attrs, slog.Time("ends_at", a.EndsAt))
			}
			log.LogAttrs(r.Context(), level, "alert", attrs...)
		}
		if n.TruncatedAlerts > 0 {
			log.WarnContext(r.Context(), "alerts truncated by alertmanager", "receiver", receiver, "truncated", n.TruncatedAlerts)
		}
		w.WriteHeader(http.StatusOK)
	})
	return mux
}

// Serve serves [Handler] on ln until ctx is cancelled, then lets in-flight requests finish
// (up to 5 s) and returns nil; it returns the error that stopped it otherwise.
func Serve(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           Handler(log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.InfoContext(ctx, "alert-logger listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Run listens on cfg.HTTPAddr and serves until ctx is cancelled.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return Serve(ctx, ln, log)
}
