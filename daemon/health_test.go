package daemon

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/tunnel"
)

func TestServerEndpoints(t *testing.T) {
	tests := []struct {
		name  string
		pprof bool
		path  string
		ready bool
		want  int
		body  string // a line the body must hold
	}{
		{name: "metrics", path: "/metrics", want: http.StatusOK},
		{name: "healthz", path: "/healthz", want: http.StatusOK},
		{name: "readyz while not ready", path: "/readyz", want: http.StatusServiceUnavailable},
		{name: "no profiles by default", path: "/debug/pprof/", want: http.StatusNotFound},
		{name: "profiles when asked for", pprof: true, path: "/debug/pprof/", want: http.StatusOK},
		{name: "heap profile when asked for", pprof: true, path: "/debug/pprof/heap", want: http.StatusOK},
		{name: "a failing sink does not make hubsync unready", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "sink hooks (webhook): failing (3 attempts): POST https://hooks.example/: 503, 0 queued\n"},
		{name: "sinks are listed only when asked for", ready: true, path: "/readyz", want: http.StatusOK, body: "ok\n"},
		{name: "a failing tunnel does not make hubsync unready", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "tunnel c2: failing for 1m0s: dial c2:443: No agent available\n"},
		{name: "tunnel summary", ready: true, path: "/readyz?verbose", want: http.StatusOK, body: "tunnels: 1 ready, 1 failing, 0 connecting\n"},
	}
	now := time.Now()
	tunnels := func() []tunnel.Status {
		return []tunnel.Status{
			{Cluster: "c1", State: tunnel.StateReady, Since: now.Add(-time.Hour), ProbeLatency: 2 * time.Millisecond},
			{Cluster: "c2", State: tunnel.StateFailing, Since: now.Add(-time.Minute), Reason: "dial c2:443: No agent available"},
		}
	}
	statuses := func() []stream.Status {
		return []stream.Status{
			{Name: "hooks", Type: "webhook", Failures: 3, LastError: "POST https://hooks.example/: 503"},
			{Name: "nats", Type: "nats", Healthy: true},
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, ln, err := newServer("127.0.0.1:0", tt.pprof, prometheus.NewRegistry(), statuses, tunnels, func() (bool, string) {
				if tt.ready {
					return true, "ok"
				}
				return false, "caches not synced"
			})
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
			resp, err := http.Get("http://" + ln.Addr().String() + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET %s: %d, want %d", tt.path, resp.StatusCode, tt.want)
			}
			if tt.body != "" && !strings.Contains(string(body), tt.body) {
				t.Errorf("GET %s: body %q lacks %q", tt.path, body, tt.body)
			}
			if tt.path == "/readyz" && (strings.Contains(string(body), "sink ") || strings.Contains(string(body), "tunnel")) {
				t.Errorf("GET /readyz lists sinks unasked: %q", body)
			}
		})
	}
}
