package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
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
		{name: "tunnel summary", ready: true, path: "/readyz?verbose", want: http.StatusOK, body: "tunnels: 2 ready, 1 failing, 0 connecting\n"},
		{name: "a paced tunnel says why", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "tunnel c3: ready for 1h0m0s, probe 2ms, paced for 20s more: the API server answered the probe 429 Too Many Requests\n"},
		{name: "a degraded bus does not make hubsync unready", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "bus stream: degraded, replicas 2 current, 0 behind, 1 offline"},
		{name: "contested objects do not make hubsync unready", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "[+]contested ok: 3 objects written by another controller (cluster-proxy: 2 profiles, managed-serviceaccount: 1 credential copy)\n"},
		{name: "a contested object's line", ready: true, path: "/readyz?verbose", want: http.StatusOK,
			body: "contested profile team-a/c1: written by cluster-proxy (field manager \"manager\") since 1m0s, 4 writes; left alone for 30s more (hold-off 1m0s)\n"},
	}
	now := time.Now()
	tunnels := func() []tunnel.Status {
		return []tunnel.Status{
			{Cluster: "c1", State: tunnel.StateReady, Since: now.Add(-time.Hour), ProbeLatency: 2 * time.Millisecond},
			{Cluster: "c2", State: tunnel.StateFailing, Since: now.Add(-time.Minute), Reason: "dial c2:443: No agent available"},
			{Cluster: "c3", State: tunnel.StateReady, Since: now.Add(-time.Hour), ProbeLatency: 2 * time.Millisecond,
				Paced: "the API server answered the probe 429 Too Many Requests", PacedUntil: now.Add(20 * time.Second)},
		}
	}
	statuses := func() []stream.Status {
		return []stream.Status{
			{Name: "hooks", Type: "webhook", Failures: 3, LastError: "POST https://hooks.example/: 503"},
			{Name: "nats", Type: "nats", Healthy: true},
		}
	}
	contested := func() []syncer.Contested {
		return []syncer.Contested{
			{Kind: syncer.KindProfile, Namespace: "team-a", Name: "c1", Writer: "manager", Controller: "cluster-proxy",
				Since: now.Add(-time.Minute), HoldOff: time.Minute, Until: now.Add(30 * time.Second), Writes: 4},
			{Kind: syncer.KindProfile, Namespace: "team-b", Name: "c1", Writer: "cluster-proxy", Controller: "cluster-proxy",
				Since: now, HoldOff: 30 * time.Second, Until: now.Add(30 * time.Second), Writes: 2},
			{Kind: syncer.KindCredential, Namespace: "team-a", Name: "c1-app", Writer: "msa", Controller: "managed-serviceaccount",
				Since: now, HoldOff: 30 * time.Second, Until: now.Add(30 * time.Second), Writes: 2},
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busLines := func(time.Time) []string {
				return []string{"bus stream: degraded, replicas 2 current, 0 behind, 1 offline (3s ago)"}
			}
			srv, ln, err := newServer("127.0.0.1:0", tt.pprof, prometheus.NewRegistry(), statuses, tunnels, contested, busLines, func() (bool, string) {
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
			if tt.path == "/readyz" && (strings.Contains(string(body), "sink ") || strings.Contains(string(body), "tunnel") || strings.Contains(string(body), "contested") || strings.Contains(string(body), "bus ")) {
				t.Errorf("GET /readyz lists sinks unasked: %q", body)
			}
		})
	}
}

// TestWriteContested: the summary line counts objects by controller and
// kind, says "no object" when there is none, and the lines per object are
// bounded.
func TestWriteContested(t *testing.T) {
	now := time.Now()
	obj := func(kind, ns, name, controller string) syncer.Contested {
		return syncer.Contested{Kind: kind, Namespace: ns, Name: name, Writer: controller, Controller: controller,
			Since: now, HoldOff: 30 * time.Second, Until: now.Add(30 * time.Second), Writes: 2}
	}
	many := make([]syncer.Contested, 0, maxContestedLines+5)
	for i := range maxContestedLines + 5 {
		many = append(many, obj(syncer.KindProfile, "ns", fmt.Sprintf("c%d", i), "cluster-proxy"))
	}
	tests := []struct {
		name      string
		in        []syncer.Contested
		want      string // the summary line
		lines     int    // lines in all
		wantLines []string
	}{
		{name: "none", want: "[+]contested ok: no object is written by another controller", lines: 1},
		{name: "one copy", in: []syncer.Contested{obj(syncer.KindCredential, "a", "c1-m", "managed-serviceaccount")},
			want: "[+]contested ok: 1 object written by another controller (managed-serviceaccount: 1 credential copy)", lines: 2},
		{name: "two kinds by one writer, one unnamed", in: []syncer.Contested{
			obj(syncer.KindCredential, "a", "c1-m", "x"), obj(syncer.KindProfile, "a", "c1", "x"), obj(syncer.KindProfile, "b", "c1", ""),
		}, want: "[+]contested ok: 3 objects written by another controller (unknown: 1 profile, x: 1 profile and 1 credential copy)", lines: 4},
		{name: "bounded", in: many, want: fmt.Sprintf("[+]contested ok: %d objects written by another controller (cluster-proxy: %d profiles)",
			len(many), len(many)), lines: maxContestedLines + 2,
			wantLines: []string{"contested ...: more objects not listed; see the hubsync_contested_objects metric and ForeignWriter Events"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeContested(&b, tt.in, now)
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			if lines[0] != tt.want {
				t.Errorf("summary = %q, want %q", lines[0], tt.want)
			}
			if len(lines) != tt.lines {
				t.Errorf("%d lines, want %d:\n%s", len(lines), tt.lines, b.String())
			}
			for _, l := range tt.wantLines {
				if !strings.Contains(b.String(), l+"\n") {
					t.Errorf("output lacks %q:\n%s", l, b.String())
				}
			}
		})
	}
}

// TestBuildInfoMetric: the registry names the running build.
func TestBuildInfoMetric(t *testing.T) {
	reg := newRegistry("v1.2.3", "0123abc")
	want := fmt.Sprintf(`
# HELP hubsync_build_info Always 1; its labels name the running build: version, commit and goversion (the Go toolchain it was built with).
# TYPE hubsync_build_info gauge
hubsync_build_info{commit="0123abc",goversion=%q,version="v1.2.3"} 1
`, runtime.Version())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hubsync_build_info"); err != nil {
		t.Error(err)
	}
}
