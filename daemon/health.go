package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/tunnel"
)

// newRegistry is the daemon's metrics registry, with the Go runtime's and
// the process's collectors, and hubsync_build_info for the build.
func newRegistry(version, commit string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hubsync_build_info",
		Help: "Always 1; its labels name the running build: version, commit and goversion (the Go toolchain it was built with).",
	}, []string{"version", "commit", "goversion"})
	info.WithLabelValues(version, commit, runtime.Version()).Set(1)
	reg.MustRegister(info)
	reg.MustRegister(collectors.NewGoCollector(
		// go_gc_heap_live_bytes, the heap the last GC kept: what the
		// daemon holds, where RSS also counts the garbage the next GC
		// frees and free pages not yet returned to the OS; and the GC's
		// targets, go_gc_gogc_percent and go_gc_gomemlimit_bytes.
		collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{
			Matcher: regexp.MustCompile(`^/gc/(heap/live:bytes|gogc:percent|gomemlimit:bytes)$`)}),
	), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newServer makes the health and metrics server and its listener.
func newServer(addr string, withPprof bool, reg *prometheus.Registry, sinkStatuses func() []stream.Status,
	tunnelStatuses func() []tunnel.Status, contested func() []syncer.Contested, busLines func(time.Time) []string,
	ready func() (bool, string)) (*http.Server, net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, why+"\n")
		if !r.URL.Query().Has("verbose") {
			return
		}
		// A sink that is failing never makes hubsync unready (restarting
		// it would not help the sink): it is only reported here.
		if sinkStatuses != nil {
			writeSinkStatuses(w, sinkStatuses())
		}
		// Nor does a cluster that cannot be reached.
		if tunnelStatuses != nil {
			writeTunnelStatuses(w, tunnelStatuses(), time.Now())
		}
		// Nor does an object that another controller writes too: hubsync
		// leaves it alone for a while, and restarting would not stop the
		// other writer.
		if contested != nil {
			writeContested(w, contested(), time.Now())
		}
		// Nor does a degraded bus (a node down, a stream below its
		// replicas, an application's copy failing): the leader keeps
		// publishing while the cluster has a quorum. A node of this
		// replica's that is catching up does (see ready).
		if busLines != nil {
			for _, l := range busLines(time.Now()) {
				fmt.Fprintln(w, l)
			}
		}
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln, nil
}

// serve serves srv on ln until ctx ends, then shuts it down, giving
// requests a few seconds to finish, and returns once Serve has.
func serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// writeSinkStatuses writes a line per sink (see stream.Status.Summary):
// its state, what waits for it and how old the oldest is, and its last
// attempt at its target.
func writeSinkStatuses(w io.Writer, sts []stream.Status) {
	now := time.Now()
	for _, s := range sts {
		fmt.Fprintln(w, s.Summary(now))
	}
}

// maxTunnelLines bounds the clusters /readyz?verbose lists one by one.
const maxTunnelLines = 100

// writeTunnelStatuses writes the pool's summary and the entries that are
// not ready or are paced (the others too while there are few).
func writeTunnelStatuses(w io.Writer, sts []tunnel.Status, now time.Time) {
	counts := map[tunnel.State]int{}
	for _, s := range sts {
		counts[s.State]++
	}
	fmt.Fprintf(w, "tunnels: %d ready, %d failing, %d connecting\n",
		counts[tunnel.StateReady], counts[tunnel.StateFailing], counts[tunnel.StateConnecting])
	lines := 0
	for _, s := range sts {
		if s.State == tunnel.StateReady && s.Paced == "" && len(sts) > maxTunnelLines {
			continue
		}
		if lines == maxTunnelLines {
			fmt.Fprintf(w, "tunnel ...: more entries not listed; see the hubsync_tunnel_state metric\n")
			return
		}
		lines++
		in := now.Sub(s.Since).Round(time.Second)
		switch s.State {
		case tunnel.StateReady:
			more := ""
			if s.Connections > 1 {
				more = fmt.Sprintf(", %d connections (every stream of one was busy)", s.Connections)
			}
			if s.Paced != "" {
				more += fmt.Sprintf(", paced for %s more: %s", s.PacedUntil.Sub(now).Round(time.Second), s.Paced)
			}
			fmt.Fprintf(w, "tunnel %s: ready for %s, probe %s%s\n", s.Cluster, in, s.ProbeLatency.Round(time.Microsecond), more)
		case tunnel.StateFailing:
			fmt.Fprintf(w, "tunnel %s: failing for %s: %s\n", s.Cluster, in, s.Reason)
		default:
			fmt.Fprintf(w, "tunnel %s: %s for %s\n", s.Cluster, s.State, in)
		}
	}
}

// maxContestedLines bounds the contested objects /readyz?verbose lists one
// by one.
const maxContestedLines = 20

// writeContested writes a summary line of the objects another controller
// writes too, by controller and kind, then a line per object (the first
// maxContestedLines). It never fails readiness: the line always reads
// "[+]contested ok".
func writeContested(w io.Writer, cs []syncer.Contested, now time.Time) {
	if len(cs) == 0 {
		fmt.Fprintln(w, "[+]contested ok: no object is written by another controller")
		return
	}
	counts := map[string]map[string]int{} // controller -> kind -> objects
	for _, c := range cs {
		who := controllerOf(c)
		if counts[who] == nil {
			counts[who] = map[string]int{}
		}
		counts[who][c.Kind]++
	}
	controllers := make([]string, 0, len(counts))
	for who := range counts {
		controllers = append(controllers, who)
	}
	sort.Strings(controllers)
	parts := make([]string, 0, len(controllers))
	for _, who := range controllers {
		var kinds []string
		for _, k := range syncer.Kinds() {
			if n := counts[who][k]; n > 0 {
				kinds = append(kinds, countOf(n, kindNoun(k)))
			}
		}
		parts = append(parts, who+": "+strings.Join(kinds, " and "))
	}
	fmt.Fprintf(w, "[+]contested ok: %s written by another controller (%s)\n", countOf(len(cs), "object"), strings.Join(parts, ", "))
	for i, c := range cs {
		if i == maxContestedLines {
			fmt.Fprintln(w, "contested ...: more objects not listed; see the hubsync_contested_objects metric and ForeignWriter Events")
			return
		}
		left := "written again now"
		if c.Until.After(now) {
			left = fmt.Sprintf("left alone for %s more", c.Until.Sub(now).Round(time.Second))
		}
		fmt.Fprintf(w, "contested %s %s/%s: written by %s (field manager %q) since %s, %d writes; %s (hold-off %s)\n",
			kindNoun(c.Kind), c.Namespace, c.Name, controllerOf(c), c.Writer, now.Sub(c.Since).Round(time.Second), c.Writes, left, c.HoldOff)
	}
}

func controllerOf(c syncer.Contested) string {
	if c.Controller == "" {
		return "unknown"
	}
	return c.Controller
}

func kindNoun(kind string) string {
	if kind == syncer.KindCredential {
		return "credential copy"
	}
	return kind
}

// countOf is "1 profile", "2 profiles", "2 credential copies".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
