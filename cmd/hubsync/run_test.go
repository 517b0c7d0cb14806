package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestServerEndpoints(t *testing.T) {
	tests := []struct {
		name  string
		pprof bool
		path  string
		want  int
	}{
		{name: "metrics", path: "/metrics", want: http.StatusOK},
		{name: "healthz", path: "/healthz", want: http.StatusOK},
		{name: "readyz while not ready", path: "/readyz", want: http.StatusServiceUnavailable},
		{name: "no profiles by default", path: "/debug/pprof/", want: http.StatusNotFound},
		{name: "profiles when asked for", pprof: true, path: "/debug/pprof/", want: http.StatusOK},
		{name: "heap profile when asked for", pprof: true, path: "/debug/pprof/heap", want: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, ln, err := newServer("127.0.0.1:0", tt.pprof, prometheus.NewRegistry(), func() (bool, string) { return false, "caches not synced" })
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
			resp, err := http.Get("http://" + ln.Addr().String() + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET %s: %d, want %d", tt.path, resp.StatusCode, tt.want)
			}
		})
	}
}
