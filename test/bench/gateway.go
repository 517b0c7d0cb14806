package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/konnectivity"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// Gateway figures (flags).
var (
	gatewayOnly       bool
	gatewayRepeats    int
	gatewayRequests   int
	gatewayLists      int
	gatewayCPUProfile string
	gatewayHot        string
	gatewayHotSeconds int
	gatewayBaseline   string
)

const (
	// gatewayIP is the managed API server's address (the tunnel bench's
	// is 127.0.0.21).
	gatewayIP = "127.0.0.22"
	// gatewayCluster is the cluster name in the gateway's paths.
	gatewayCluster = "bench-gw"
	// gatewayNS holds the measured ConfigMaps on the managed cluster, and
	// the hub ServiceAccount whose token the gateway's clients use.
	gatewayNS = "gateway-bench"
	// gatewayListSize ConfigMaps of about 1 KiB make the large list.
	gatewayListSize = 2000
)

// The measured requests: one small object, and the whole namespace.
const (
	gatewaySmallPath = "/api/v1/namespaces/" + gatewayNS + "/configmaps/small"
	gatewayListPath  = "/api/v1/namespaces/" + gatewayNS + "/configmaps"
)

// gatewayMode is one way of sending the measured requests to the managed
// API server.
type gatewayMode struct {
	name   string
	base   string // what precedes the Kubernetes path in the URL
	rt     http.RoundTripper
	header http.Header
}

// fetch GETs path and reads the whole body; it returns the wall-clock
// time from sending the request to the body's end, and the body's bytes
// (decompressed).
func (m gatewayMode) fetch(ctx context.Context, path string) (time.Duration, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+path, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header = m.header.Clone()
	start := time.Now()
	resp, err := m.rt.RoundTrip(req)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: GET %s: %w", m.name, path, err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: GET %s: reading the body: %w", m.name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: GET %s: %s", m.name, path, resp.Status)
	}
	return took, n, nil
}

// gatewayRun GETs path n times from conc goroutines (n/conc each) and
// returns every request's latency (sorted), the bytes read and the wall
// time of the whole run.
func gatewayRun(ctx context.Context, m gatewayMode, path string, conc, n int) ([]time.Duration, int64, time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	var total atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	var first error
	per := n / conc
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for range per {
				d, b, err := m.fetch(ctx, path)
				total.Add(b)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				lat = append(lat, d)
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if first != nil {
		return nil, 0, 0, first
	}
	slices.Sort(lat)
	return lat, total.Load(), wall, nil
}

// benchGateway measures, against a real konnectivity proxy-server, agent
// and managed kube-apiserver and the hub's TokenReview, a small GET's
// p50/p99 and a large list's throughput through the access gateway
// against the same requests sent straight to the managed API server, and
// through a gateway whose pool dials the API server directly, which
// separates the gateway's own cost from konnectivity's.
func benchGateway(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) error {
	fmt.Println("\n== access gateway: hub TokenReview, a real konnectivity proxy-server + agent and managed kube-apiserver")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := startReach(ctx, cp, "bench-gateway", gatewayIP)
	if err != nil {
		return err
	}
	defer r.stop()
	dir, srv, m := r.dir, r.server, r.managed
	mcfg := rest.CopyConfig(m.Config)
	mcfg.QPS, mcfg.Burst = 2000, 4000
	mg, err := kubernetes.NewForConfig(mcfg)
	if err != nil {
		return err
	}
	hcfg := rest.CopyConfig(cp.Config)
	hcfg.QPS, hcfg.Burst = 2000, 4000
	hub, err := kubernetes.NewForConfig(hcfg)
	if err != nil {
		return err
	}

	// The gateway's impersonating ManagedServiceAccount, granted as the
	// shipped manifest says.
	msaNS, msa, err := applyGatewayRBAC(ctx, mg)
	if err != nil {
		return err
	}
	msaToken, err := m.ServiceAccountToken(ctx, msaNS, msa, time.Hour)
	if err != nil {
		return err
	}
	// The hub identity: a ServiceAccount on the hub, and what the hub's
	// TokenReview says it is.
	hubToken, id, err := benchHubIdentity(ctx, hub)
	if err != nil {
		return err
	}
	// The objects, and who may read them: the prefixed hub identity and,
	// for the direct requests, a managed ServiceAccount.
	directToken, err := m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour)
	if err != nil {
		return err
	}
	if err := grantGatewayReaders(ctx, mg, gateway.ImpersonatedUser(id), "direct-reader"); err != nil {
		return err
	}
	listBytes, err := createGatewayObjects(ctx, mg)
	// The managed API server shares the hub's etcd: leave it as it was.
	defer func() {
		_ = mg.CoreV1().ConfigMaps(gatewayNS).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	}()
	if err != nil {
		return err
	}

	// Two hubsync daemons, each the real binary with the shipped defaults
	// and its gateway on: one whose pool goes through konnectivity, one
	// whose pool dials the API server directly.
	daemons, err := startGatewayDaemons(ctx, cp, binary, logs, dir, srv, m, msa, msaToken)
	if err != nil {
		return err
	}
	defer daemons.stop()
	ca := daemons.ca

	// Clients: HTTP/2 with keep-alive, TLS verified, as client-go's.
	managedRoots := x509.NewCertPool()
	managedRoots.AppendCertsFromPEM(m.CA)
	gatewayRoots := x509.NewCertPool()
	gatewayRoots.AppendCertsFromPEM(ca.PEM)
	newClient := func(roots *x509.CertPool) *http.Transport {
		return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64}
	}
	directClient, gwClient, gwDirectClient, impClient := newClient(managedRoots), newClient(gatewayRoots), newClient(gatewayRoots), newClient(managedRoots)
	for _, c := range []*http.Transport{directClient, gwClient, gwDirectClient, impClient} {
		defer c.CloseIdleConnections()
	}
	bearer := func(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }
	// What the gateway sends the API server, sent straight: the
	// impersonating credential with the prefixed identity's headers.
	impHeader := http.Header{"Authorization": {"Bearer " + msaToken}, "Impersonate-User": {gateway.ImpersonatedUser(id)}}
	for _, g := range id.Groups {
		impHeader.Add("Impersonate-Group", gateway.Prefix+g)
	}
	modes := []gatewayMode{
		{"direct", "https://" + m.Address, directClient, bearer(directToken)},
		{"hubsync", daemons.konnectivity.url + "/" + gatewayCluster, gwClient, bearer(hubToken)},
		{"hubsync, direct dialer", daemons.direct.url + "/" + gatewayCluster, gwDirectClient, bearer(hubToken)},
		{"direct, impersonating", "https://" + m.Address, impClient, impHeader},
	}
	const direct, gw, gwDirect, imp, base = 0, 1, 2, 3, 4
	if daemons.baseline.d != nil {
		modes = append(modes, gatewayMode{baselineRole, daemons.baseline.url + "/" + gatewayCluster, newClient(gatewayRoots), bearer(hubToken)})
		defer modes[base].rt.(*http.Transport).CloseIdleConnections()
	}
	bare := -1
	if gatewayHot == "" {
		// The floor under the gateway's own hop: the plainest Go proxy,
		// sending the same request as "direct, impersonating".
		caFile := filepath.Join(dir, "managed-ca.crt")
		if err := os.WriteFile(caFile, m.CA, 0o600); err != nil {
			return err
		}
		bp, err := startBareProxy(ctx, m.Address, caFile, daemons.certFile, daemons.keyFile, logs)
		if err != nil {
			return err
		}
		defer bp.stop()
		daemons.bare = bp
		bare = len(modes)
		modes = append(modes, gatewayMode{bareProxyRole, bp.url, newClient(gatewayRoots), impHeader})
		defer modes[bare].rt.(*http.Transport).CloseIdleConnections()
	}

	// Ready when every mode reads the object (RBAC is applied a moment
	// after it is written); then show who each mode is on the cluster.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, md := range modes {
			if _, _, err := md.fetch(ctx, gatewaySmallPath); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, md := range modes {
			if _, _, ferr := md.fetch(ctx, gatewaySmallPath); ferr != nil {
				return fmt.Errorf("not ready within a minute: %w", ferr)
			}
		}
		return err
	}
	fmt.Println("the managed API server sees:")
	for _, md := range modes {
		who, err := whoAmI(ctx, md)
		if err != nil {
			return err
		}
		fmt.Printf("  %-22s as %s\n", md.name, who)
	}
	fmt.Printf("  gateway modes: hub token reviewed by the hub's TokenReview (positive answers cached %s), sent over the pool as ManagedServiceAccount %s/%s with Impersonate-User and %d Impersonate-Group\n",
		config.Default().Gateway.ReviewCacheTTL.Duration, msaNS, msa, len(id.Groups))
	fmt.Println("  direct, impersonating (for diagnosis): the gateway's outgoing headers sent straight to the API server")

	procs := daemons.procs()
	if gatewayHot != "" {
		var baseline *gatewayMode
		if daemons.baseline.d != nil {
			baseline = &modes[base]
		}
		return gatewayHotLoop(ctx, daemons, procs, modes[gw], baseline)
	}
	// What every process uses idle, over the same clock as the figures
	// below: per request, the CPU figures include it for the request's
	// share of wall time (more in slower modes).
	idle0, idleStart := procs.cpu(), time.Now()
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	idle1, idleWall := procs.cpu(), time.Since(idleStart)
	fmt.Print("CPU used idle, ms per second:")
	for _, r := range procs.roles() {
		fmt.Printf(" %s %.1f;", r, float64(idle1[r]-idle0[r])/float64(time.Millisecond)/idleWall.Seconds())
	}
	fmt.Println()

	// Small GETs.
	goalSmall := map[int][]float64{}
	hop := map[int][]float64{}
	hopFloor := map[int][]float64{}
	bareHops, bareCPU, bareRatio := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
	smallCPU := map[int][]float64{}
	baseCPU := map[int][]float64{}
	fmt.Printf("small GET %s, %d requests per mode, concurrency and repeat; modes interleaved in each repeat\n", gatewaySmallPath, gatewayRequests)
	fmt.Printf("(every process here shares %d cores: once they are saturated, latency follows the total CPU per request)\n", runtime.NumCPU())
	for _, conc := range []int{1, 32, 128} {
		for _, md := range modes {
			if _, _, _, err := gatewayRun(ctx, md, gatewaySmallPath, conc, min(conc*4, gatewayRequests)); err != nil {
				return err
			}
		}
		p50s := make([][]time.Duration, len(modes))
		p99s := make([][]time.Duration, len(modes))
		var gw50, gw99, gwd50, gwd99, imp50, konn50, hop50 []float64
		cpu := newCPUTally(len(modes), procs)
		for r := range gatewayRepeats {
			for k := range modes {
				i := (k + r) % len(modes)
				if err := cpu.measure(i, gatewayRequests, func() error {
					lat, _, _, err := gatewayRun(ctx, modes[i], gatewaySmallPath, conc, gatewayRequests)
					if err == nil {
						p50s[i] = append(p50s[i], quantile(lat, 50))
						p99s[i] = append(p99s[i], quantile(lat, 99))
					}
					return err
				}); err != nil {
					return err
				}
			}
			gw50 = append(gw50, ratio(p50s[gw][r], p50s[direct][r]))
			gw99 = append(gw99, ratio(p99s[gw][r], p99s[direct][r]))
			gwd50 = append(gwd50, ratio(p50s[gwDirect][r], p50s[direct][r]))
			gwd99 = append(gwd99, ratio(p99s[gwDirect][r], p99s[direct][r]))
			imp50 = append(imp50, ratio(p50s[imp][r], p50s[direct][r]))
			konn50 = append(konn50, ratio(p50s[gw][r], p50s[gwDirect][r]))
			hop50 = append(hop50, ratio(p50s[gwDirect][r], p50s[imp][r]))
			if bare >= 0 {
				bareHops[conc] = append(bareHops[conc], ratio(p50s[bare][r], p50s[imp][r]))
			}
		}
		goalSmall[conc], hop[conc] = gw50, hop50
		fmt.Printf("concurrency %d (median over %d repeats, range in brackets):\n", conc, gatewayRepeats)
		for i, md := range modes {
			fmt.Printf("  %-22s p50 %s  p99 %s\n", md.name, durSpread(p50s[i]), durSpread(p99s[i]))
		}
		fmt.Printf("  hubsync / direct:                p50 %s  p99 %s\n", ratioSpread(gw50), ratioSpread(gw99))
		fmt.Printf("  hubsync, direct dialer / direct: p50 %s  p99 %s (the gateway without konnectivity)\n", ratioSpread(gwd50), ratioSpread(gwd99))
		goal := ""
		if conc == 32 {
			goal = " (goal <= 1.20x: " + gatewayGoal(hop50, func(r float64) bool { return r <= 1.2 }) + ")"
		}
		fmt.Printf("  hubsync, direct dialer / direct, impersonating: p50 %s%s (the gateway's own hop: the same request, the same identity)\n", ratioSpread(hop50), goal)
		fmt.Printf("  hubsync / hubsync, direct dialer: p50 %s (konnectivity's relays); direct, impersonating / direct: p50 %s (the API server's impersonation checks)\n",
			ratioSpread(konn50), ratioSpread(imp50))
		cpu.print(modes, time.Microsecond, "µs")
		hopFloor[conc] = cpu.proxyFloor(imp)
		fmt.Printf("  a proxy costing two of the clients' TLS and HTTP/2 endpoints (their CPU per request when direct, impersonating) would make that hop %s here\n",
			ratioSpread(hopFloor[conc]))
		if bare >= 0 {
			bareCPU[conc] = cpu.perRun(bare, bareProxyRole, time.Microsecond)
			bareRatio[conc] = perRepeat(cpu.perRun(gwDirect, "hubsync, direct dialer", time.Microsecond), bareCPU[conc])
			fmt.Printf("  bare Go proxy / direct, impersonating: p50 %s (the same hop through httputil.ReverseProxy with nothing of its own); its CPU per request %s µs; hubsync's with the direct dialer / the bare proxy's, per repeat: %s\n",
				ratioSpread(bareHops[conc]), floatSpread(bareCPU[conc], "%.0f"), ratioSpread(bareRatio[conc]))
		}
		smallCPU[conc] = cpu.perRun(gw, "hubsync", time.Microsecond)
		goal = ""
		if conc == 32 {
			goal = " (goal <= 150 µs: " + gatewayGoal(smallCPU[conc], func(us float64) bool { return us <= 150 }) + ")"
		}
		fmt.Printf("  CPU of the hubsync process per small GET through konnectivity: %s µs%s; with the direct dialer %s µs\n",
			floatSpread(smallCPU[conc], "%.0f"), goal, floatSpread(cpu.perRun(gwDirect, "hubsync, direct dialer", time.Microsecond), "%.0f"))
		if daemons.baseline.d != nil {
			b := cpu.perRun(base, baselineRole, time.Microsecond)
			r := perRepeat(smallCPU[conc], b)
			baseCPU[conc] = r
			fmt.Printf("  the baseline build (%s) over konnectivity: %s µs; this build / baseline, per repeat: %s\n", gatewayBaseline, floatSpread(b, "%.0f"), ratioSpread(r))
		}
	}
	if err := daemons.konnectivity.profileRequests(ctx, modes[gw], "small GETs", gatewaySmallPath, 32, gatewayRequests); err != nil {
		return err
	}

	// The large list: compressed on the wire, as the API server does when
	// a client (client-go, Go's transport) accepts gzip.
	var wire []string
	for _, i := range []int{direct, gw} {
		n, enc, err := wireBytes(ctx, modes[i], gatewayListPath)
		if err != nil {
			return err
		}
		wire = append(wire, fmt.Sprintf("%s %.2f MB %s", modes[i].name, float64(n)/1e6, enc))
	}
	fmt.Printf("large LIST %s: %d ConfigMaps, %.2f MB of JSON (on the wire: %s), %d lists per mode, concurrency and repeat; modes interleaved in each repeat\n",
		gatewayListPath, gatewayListSize+1, float64(listBytes)/1e6, strings.Join(wire, ", "), gatewayLists)
	goalList := map[int][]float64{}
	directList := map[int][]float64{}
	listCeiling := map[int]float64{}
	for _, conc := range []int{1, 4} {
		for _, md := range modes {
			if _, _, _, err := gatewayRun(ctx, md, gatewayListPath, conc, conc); err != nil {
				return err
			}
		}
		mbps := make([][]float64, len(modes))
		rate := make([][]float64, len(modes))
		p50s := make([][]time.Duration, len(modes))
		var gwPct, gwdPct, impPct []float64
		cpu := newCPUTally(len(modes), procs)
		for r := range gatewayRepeats {
			for k := range modes {
				i := (k + r) % len(modes)
				if err := cpu.measure(i, gatewayLists, func() error {
					lat, n, wall, err := gatewayRun(ctx, modes[i], gatewayListPath, conc, gatewayLists)
					if err == nil {
						mbps[i] = append(mbps[i], float64(n)/1e6/wall.Seconds())
						rate[i] = append(rate[i], float64(gatewayLists)/wall.Seconds())
						p50s[i] = append(p50s[i], quantile(lat, 50))
					}
					return err
				}); err != nil {
					return err
				}
			}
			gwPct = append(gwPct, 100*mbps[gw][r]/mbps[direct][r])
			gwdPct = append(gwdPct, 100*mbps[gwDirect][r]/mbps[direct][r])
			impPct = append(impPct, 100*mbps[imp][r]/mbps[direct][r])
		}
		goalList[conc], directList[conc] = gwPct, gwdPct
		fmt.Printf("concurrency %d (median over %d repeats, range in brackets):\n", conc, gatewayRepeats)
		for i, md := range modes {
			fmt.Printf("  %-22s %s MB/s  %s lists/s  list p50 %s\n", md.name, floatSpread(mbps[i], "%.1f"), floatSpread(rate[i], "%.1f"), durSpread(p50s[i]))
		}
		fmt.Printf("  hubsync / direct throughput: %s (goal >= 80%%: %s)\n", percentSpread(gwPct), gatewayGoal(gwPct, func(p float64) bool { return p >= 80 }))
		fmt.Printf("  hubsync, direct dialer / direct: %s; direct, impersonating / direct: %s\n", percentSpread(gwdPct), percentSpread(impPct))
		cpu.print(modes, time.Millisecond, "ms")
		// Every process shares the cores: once they are saturated, the
		// lists' rate follows the total CPU per list. Without hubsync's
		// own share, the path through konnectivity would still cost the
		// relays' and the ceiling is what is left.
		d, g, h := cpu.perRequest(direct, ""), cpu.perRequest(gw, ""), cpu.perRequest(gw, "hubsync")
		relays := cpu.perRequest(gw, "proxy-server") + cpu.perRequest(gw, "proxy-agent")
		fmt.Printf("  CPU per list, every process: direct %.0f ms, through hubsync and konnectivity %.0f ms (hubsync %.0f ms, the proxy-server and agent %.0f ms); "+
			"a gateway that cost no CPU would reach %.0f%% of direct here\n", d, g, h, relays, 100*d/(g-h))
		listCeiling[conc] = 100 * d / (g - h)
	}
	if err := daemons.konnectivity.profileRequests(ctx, modes[gw], "large LISTs", gatewayListPath, 1, gatewayLists); err != nil {
		return err
	}

	reviews := daemons.reviews()
	fmt.Printf("TokenReview: %.0f gateway requests authenticated by a hub TokenReview, %.0f from the cache (hubsync_gateway_token_review_cache_hits_total)\n",
		reviews.authenticated, reviews.cached)
	fmt.Println("gateway goals in this run (median over repeats; repeats meeting the goal):")
	fmt.Printf("  CPU of the hubsync process per small GET at concurrency 32 through konnectivity: %s µs, goal <= 150 µs: %s\n",
		floatSpread(smallCPU[32], "%.0f"), gatewayGoal(smallCPU[32], func(us float64) bool { return us <= 150 }))
	if b := baseCPU[32]; len(b) > 0 {
		fmt.Printf("  CPU per small GET at concurrency 32, this build / the baseline build, in the same repeats: %s\n", ratioSpread(b))
	}
	fmt.Printf("  small GET p50 at concurrency 32, hubsync, direct dialer / direct, impersonating: %s, goal <= 1.20x: %s (a proxy costing two client endpoints: %s)\n",
		ratioSpread(hop[32]), gatewayGoal(hop[32], func(r float64) bool { return r <= 1.2 }), ratioSpread(hopFloor[32]))
	if len(bareHops[32]) > 0 {
		fmt.Printf("  the same hop through the bare Go proxy: %s (repeats <= 1.20x: %s), its CPU %s µs per request; hubsync, direct dialer / bare Go proxy, CPU per request: %s\n",
			ratioSpread(bareHops[32]), gatewayGoal(bareHops[32], func(r float64) bool { return r <= 1.2 }), floatSpread(bareCPU[32], "%.0f"), ratioSpread(bareRatio[32]))
	}
	for _, conc := range []int{1, 4} {
		fmt.Printf("  large LIST throughput at concurrency %d, hubsync / direct: %s, goal >= 80%%: %s (direct dialer: %s; through konnectivity with a gateway of no cost: %.0f%%)\n",
			conc, percentSpread(goalList[conc]), gatewayGoal(goalList[conc], func(p float64) bool { return p >= 80 }), percentSpread(directList[conc]), listCeiling[conc])
	}
	fmt.Printf("  small GET p50 at concurrency 32, hubsync / direct: %s (for the record: konnectivity's relays share the cores)\n", ratioSpread(goalSmall[32]))
	return nil
}

// gatewayHotLoop loads the hubsync gateway through konnectivity with one
// kind of request (--gateway-hot) in rounds of 5 s and prints the CPU of
// the hubsync process per request in each, with a CPU profile of the
// whole load when --gateway-cpuprofile names a directory. With a baseline
// build (--gateway-baseline), the rounds alternate between the two, and
// each pair of rounds gives this build's CPU per request over the
// baseline's, and the relays' (proxy-server and agent) likewise.
func gatewayHotLoop(ctx context.Context, daemons *gatewayDaemons, procs gatewayProcs, md gatewayMode, baseline *gatewayMode) error {
	path, conc, n := gatewaySmallPath, 32, gatewayRequests
	if gatewayHot == "list" {
		path, conc, n = gatewayListPath, 1, gatewayLists
	} else if gatewayHot != "small" {
		return fmt.Errorf("--gateway-hot: want small or list, not %q", gatewayHot)
	}
	type round struct{ us, relays, allocs, bytes, calls, relayCalls float64 }
	var rounds, baseRounds []round
	// one loads md (the role's daemon) for 5 s and returns its CPU and
	// the relays' per request.
	one := func(ctx context.Context, md gatewayMode, d gatewayDaemon, role string) (round, error) {
		mem0, err := d.d.Scrape()
		if err != nil {
			return round{}, err
		}
		before, calls0, count, start := procs.cpu(), procs.syscalls(), 0, time.Now()
		for time.Since(start) < 5*time.Second {
			if _, _, _, err := gatewayRun(ctx, md, path, conc, n); err != nil {
				return round{}, err
			}
			count += n
		}
		after, calls1 := procs.cpu(), procs.syscalls()
		mem1, err := d.d.Scrape()
		if err != nil {
			return round{}, err
		}
		per := func(r string) float64 {
			return float64(after[r]-before[r]) / float64(time.Microsecond) / float64(count)
		}
		perMem := func(name string) float64 { return (mem1.Value(name, nil) - mem0.Value(name, nil)) / float64(count) }
		perCalls := func(r string) float64 { return float64(calls1[r]-calls0[r]) / float64(count) }
		r := round{us: per(role), relays: per("proxy-server") + per("proxy-agent"),
			allocs: perMem("go_memstats_mallocs_total"), bytes: perMem("go_memstats_alloc_bytes_total"),
			calls: perCalls(role), relayCalls: perCalls("proxy-server") + perCalls("proxy-agent")}
		fmt.Printf("  %-18s %d requests in %s: %.0f µs of CPU per request (relays %.0f µs), %.0f allocations (%.1f KiB), %.2f read+write syscalls (relays %.2f), %.0f requests/s\n", role, count,
			time.Since(start).Round(time.Millisecond), r.us, r.relays, r.allocs, r.bytes/1024, r.calls, r.relayCalls, float64(count)/time.Since(start).Seconds())
		return r, nil
	}
	type side struct {
		md     gatewayMode
		d      gatewayDaemon
		role   string
		rounds *[]round
	}
	sides := []side{{md, daemons.konnectivity, "hubsync", &rounds}}
	if baseline != nil {
		sides = append(sides, side{*baseline, daemons.baseline, baselineRole, &baseRounds})
	}
	load := func(ctx context.Context) error {
		for ctx.Err() == nil {
			for _, sd := range sides {
				r, err := one(ctx, sd.md, sd.d, sd.role)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				*sd.rounds = append(*sd.rounds, r)
			}
		}
		return nil
	}
	fmt.Printf("--gateway-hot %s: GET %s at concurrency %d through hubsync over konnectivity for %d s\n", gatewayHot, path, conc, gatewayHotSeconds)
	hctx, cancel := context.WithTimeout(ctx, time.Duration(gatewayHotSeconds)*time.Second)
	defer cancel()
	var err error
	if gatewayCPUProfile != "" {
		file := filepath.Join(gatewayCPUProfile, "hubsync-hot-"+gatewayHot+".pprof")
		allocs := filepath.Join(gatewayCPUProfile, "hubsync-hot-"+gatewayHot+"-allocs.pprof")
		aerr := make(chan error, 1)
		go func() { aerr <- daemons.konnectivity.fetchProfile(ctx, allocs, "allocs", gatewayHotSeconds-1) }()
		err = daemons.konnectivity.profileFor(ctx, file, gatewayHotSeconds, load)
		err = errors.Join(err, <-aerr)
		fmt.Println("CPU profile of the hubsync process:", file)
		fmt.Println("allocations of the hubsync process over the same load:", allocs)
	} else {
		err = load(hctx)
	}
	if err != nil {
		return err
	}
	var us, relays, allocs, kib, calls, relayCalls, ratios, relayRatios, baseAllocs, baseKiB, baseCalls, baseRelayCalls []float64
	for i, r := range rounds {
		us, relays, allocs, kib = append(us, r.us), append(relays, r.relays), append(allocs, r.allocs), append(kib, r.bytes/1024)
		calls, relayCalls = append(calls, r.calls), append(relayCalls, r.relayCalls)
		if i < len(baseRounds) {
			b := baseRounds[i]
			ratios = append(ratios, r.us/b.us)
			relayRatios = append(relayRatios, r.relays/b.relays)
			baseAllocs, baseKiB = append(baseAllocs, b.allocs), append(baseKiB, b.bytes/1024)
			baseCalls, baseRelayCalls = append(baseCalls, b.calls), append(baseRelayCalls, b.relayCalls)
		}
	}
	if len(rounds) > 0 {
		fmt.Printf("hubsync per request over %d rounds of 5 s: CPU %s µs, the relays' %s µs; %s allocations, %s KiB allocated; %s read+write syscalls, the relays' %s\n",
			len(rounds), floatSpread(us, "%.0f"), floatSpread(relays, "%.0f"), floatSpread(allocs, "%.0f"), floatSpread(kib, "%.1f"),
			floatSpread(calls, "%.2f"), floatSpread(relayCalls, "%.2f"))
	}
	if len(ratios) > 0 {
		fmt.Printf("this build / the baseline, CPU per request over %d pairs of rounds: hubsync %s, the relays %s; the baseline's allocations %s (%s KiB), syscalls %s, the relays' %s\n",
			len(ratios), ratioSpread(ratios), ratioSpread(relayRatios), floatSpread(baseAllocs, "%.0f"), floatSpread(baseKiB, "%.1f"),
			floatSpread(baseCalls, "%.2f"), floatSpread(baseRelayCalls, "%.2f"))
	}
	return nil
}

// The processes whose CPU time the gateway figures break down, in the
// order printed.
var gatewayRoles = []string{"clients", "hubsync", "hubsync, direct dialer", baselineRole, bareProxyRole, "managed kube-apiserver", "etcd", "proxy-server", "proxy-agent", "hub kube-apiserver"}

// roles are the roles of gatewayRoles that have a process in this run.
func (p gatewayProcs) roles() []string {
	var out []string
	for _, r := range gatewayRoles {
		if _, daemon := p.daemons[r]; daemon || !strings.HasPrefix(r, "hubsync") && r != bareProxyRole {
			out = append(out, r)
		}
	}
	return out
}

// gatewayProcs finds the processes of gatewayRoles: this process (the
// clients), the two hubsync daemons by pid, the rest among its children.
type gatewayProcs struct {
	daemons map[string]int // role -> pid
}

// cpu is the CPU time used so far by each role, to the nanosecond where
// the kernel keeps it (fleet.ProcessRunTime).
func (p gatewayProcs) cpu() map[string]time.Duration {
	out := map[string]time.Duration{}
	if c, err := fleet.ProcessRunTime(os.Getpid()); err == nil {
		out["clients"] = c
	}
	for role, pid := range p.daemons {
		if c, err := fleet.ProcessRunTime(pid); err == nil {
			out[role] = c
		}
	}
	for _, c := range children() {
		role := c.name
		switch {
		case role == "kube-apiserver":
			role = "hub kube-apiserver"
			if cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.pid), "cmdline")); bytes.Contains(cmd, []byte("--bind-address="+gatewayIP)) {
				role = "managed kube-apiserver"
			}
		case role == "hubsync" || !slices.Contains(gatewayRoles, role):
			continue
		}
		if cpu, err := fleet.ProcessRunTime(c.pid); err == nil {
			out[role] += cpu
		}
	}
	return out
}

// syscalls is the read and write system calls made so far by each
// daemon role and by the relays (/proc/<pid>/io): a count the machine's
// speed does not move, unlike CPU time.
func (p gatewayProcs) syscalls() map[string]int64 {
	out := map[string]int64{}
	for role, pid := range p.daemons {
		out[role] = processSyscalls(pid)
	}
	for _, c := range children() {
		if c.name == "proxy-server" || c.name == "proxy-agent" {
			out[c.name] += processSyscalls(c.pid)
		}
	}
	return out
}

// processSyscalls is a process's read and write system calls so far (0
// when the kernel does not say).
func processSyscalls(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "io"))
	if err != nil {
		return 0
	}
	var n int64
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || (name != "syscr" && name != "syscw") {
			continue
		}
		c, _ := strconv.ParseInt(v, 10, 64)
		n += c
	}
	return n
}

// cpuTally sums, per mode, the CPU time each role used during the timed
// runs, and the requests they made; and keeps each run's figures.
type cpuTally struct {
	procs    gatewayProcs
	cpu      []map[string]time.Duration
	requests []int
	runs     [][]map[string]time.Duration // per mode, per run: CPU per request
}

func newCPUTally(modes int, procs gatewayProcs) *cpuTally {
	t := &cpuTally{procs: procs, cpu: make([]map[string]time.Duration, modes), requests: make([]int, modes), runs: make([][]map[string]time.Duration, modes)}
	for i := range t.cpu {
		t.cpu[i] = map[string]time.Duration{}
	}
	return t
}

// measure runs f, a timed run of n requests of mode i, and adds the CPU
// time each role used meanwhile.
func (t *cpuTally) measure(i, n int, f func() error) error {
	before := t.procs.cpu()
	if err := f(); err != nil {
		return err
	}
	run := map[string]time.Duration{}
	for role, c := range t.procs.cpu() {
		t.cpu[i][role] += c - before[role]
		run[role] = (c - before[role]) / time.Duration(n)
	}
	t.runs[i] = append(t.runs[i], run)
	t.requests[i] += n
	return nil
}

// perRun is role's CPU per request of mode i in each run, in unit.
func (t *cpuTally) perRun(i int, role string, unit time.Duration) []float64 {
	var out []float64
	for _, run := range t.runs[i] {
		out = append(out, float64(run[role])/float64(unit))
	}
	return out
}

// perRepeat is a[i]/b[i] for each repeat i.
func perRepeat(a, b []float64) []float64 {
	out := make([]float64, 0, len(b))
	for i := range b {
		out = append(out, a[i]/b[i])
	}
	return out
}

// proxyFloor is, for each run of mode i, what a proxy in its path that
// cost two of the clients' endpoints would make its latency once the
// cores are saturated: (every process's CPU per request + twice the
// clients') over every process's. Latency then follows the total CPU per
// request.
func (t *cpuTally) proxyFloor(i int) []float64 {
	var out []float64
	for _, run := range t.runs[i] {
		var total time.Duration
		for _, c := range run {
			total += c
		}
		if total > 0 {
			out = append(out, float64(total+2*run["clients"])/float64(total))
		}
	}
	return out
}

// perRequest is the CPU per request of mode i in ms, over every run: of
// role, or of every role when role is "".
func (t *cpuTally) perRequest(i int, role string) float64 {
	var sum time.Duration
	for r, c := range t.cpu[i] {
		if role == "" || r == role {
			sum += c
		}
	}
	return float64(sum) / float64(time.Millisecond) / float64(t.requests[i])
}

// print writes the CPU time per request by role, in unit.
func (t *cpuTally) print(modes []gatewayMode, unit time.Duration, unitName string) {
	fmt.Printf("  CPU per request in %s, by process, over every repeat:\n    %-22s", unitName, "")
	for _, r := range t.procs.roles() {
		fmt.Printf("  %s", r)
	}
	fmt.Println("   total")
	for i, md := range modes {
		per := func(d time.Duration) float64 { return float64(d) / float64(unit) / float64(t.requests[i]) }
		fmt.Printf("    %-22s", md.name)
		var total time.Duration
		for _, r := range t.procs.roles() {
			fmt.Printf("  %*.0f", len(r), per(t.cpu[i][r]))
			total += t.cpu[i][r]
		}
		fmt.Printf("  %6.0f\n", per(total))
	}
}

// gatewayDaemon is a hubsync daemon serving the gateway.
type gatewayDaemon struct {
	d   *fleet.Daemon
	url string
}

// profile fetches a CPU profile of the daemon (server.pprof) into path
// while load runs again and again.
func (g gatewayDaemon) profile(ctx context.Context, path string, load func(context.Context) error) error {
	return g.profileFor(ctx, path, 10, func(ctx context.Context) error {
		for ctx.Err() == nil {
			if err := load(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
		return nil
	})
}

// profileRequests, with --gateway-cpuprofile, writes a CPU profile of the
// daemon while md sends n GETs of path at concurrency conc again and again.
func (g gatewayDaemon) profileRequests(ctx context.Context, md gatewayMode, what, path string, conc, n int) error {
	if gatewayCPUProfile == "" {
		return nil
	}
	file := filepath.Join(gatewayCPUProfile, fmt.Sprintf("hubsync-%s-c%d.pprof", strings.ReplaceAll(what, " ", "-"), conc))
	if err := g.profile(ctx, file, func(ctx context.Context) error {
		_, _, _, err := gatewayRun(ctx, md, path, conc, n)
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("CPU profile of the hubsync process serving %s at concurrency %d through konnectivity: %s\n", what, conc, file)
	return nil
}

// profileFor fetches a CPU profile of the daemon over seconds into path
// while load runs (until its context ends).
func (g gatewayDaemon) profileFor(ctx context.Context, path string, seconds int, load func(context.Context) error) error {
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadErr := make(chan error, 1)
	go func() { loadErr <- load(lctx) }()
	err := g.fetchProfile(ctx, path, "profile", seconds)
	stopLoad()
	if lerr := <-loadErr; lerr != nil {
		return lerr
	}
	return err
}

// fetchProfile writes the daemon's pprof profile kind (profile: CPU;
// allocs: allocations) over the next seconds into path.
func (g gatewayDaemon) fetchProfile(ctx context.Context, path, kind string, seconds int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", g.d.Address, kind, seconds), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s profile of hubsync: %w", kind, err)
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("%s profile of hubsync: %w", kind, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s profile of hubsync: %s: %s", kind, resp.Status, data)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// gatewayDaemons are the two daemons the gateway figures measure, with
// the CA of their serving certificate.
type gatewayDaemons struct {
	konnectivity, direct gatewayDaemon
	// baseline is another build over konnectivity (--gateway-baseline),
	// for before/after figures in one run; d is nil without it.
	baseline gatewayDaemon
	ca       *pki.CA
	// certFile and keyFile are the daemons' serving pair, from ca.
	certFile, keyFile string
	// bare is the bare Go proxy, when it runs.
	bare *bareProxy
}

func (g *gatewayDaemons) all() []gatewayDaemon {
	var out []gatewayDaemon
	for _, d := range []gatewayDaemon{g.konnectivity, g.direct, g.baseline} {
		if d.d != nil {
			out = append(out, d)
		}
	}
	return out
}

func (g *gatewayDaemons) stop() {
	for _, d := range g.all() {
		_ = d.d.Stop()
	}
}

func (g *gatewayDaemons) procs() gatewayProcs {
	p := gatewayProcs{daemons: map[string]int{"hubsync": g.konnectivity.d.Pid(), "hubsync, direct dialer": g.direct.d.Pid()}}
	if g.baseline.d != nil {
		p.daemons[baselineRole] = g.baseline.d.Pid()
	}
	if g.bare != nil {
		p.daemons[bareProxyRole] = g.bare.cmd.Process.Pid
	}
	return p
}

// baselineRole is the --gateway-baseline daemon's mode and process.
const baselineRole = "hubsync, baseline"

// reviews sums the daemons' TokenReview figures.
func (g *gatewayDaemons) reviews() (r struct{ authenticated, cached float64 }) {
	for _, d := range g.all() {
		m, err := d.d.Scrape()
		if err != nil {
			continue
		}
		r.authenticated += m.Value("hubsync_gateway_token_reviews_total", testutil.Labels{"result": "authenticated"})
		r.cached += m.Value("hubsync_gateway_token_review_cache_hits_total", nil)
	}
	return r
}

// startGatewayDaemons registers the managed API server m on the hub as
// gatewayCluster (its ManagedCluster, with the impersonating
// ManagedServiceAccount's token) and starts two hubsync daemons with the
// shipped defaults, each serving the gateway on loopback: one whose pool
// goes through the konnectivity proxy-server srv, one whose pool dials
// the API server directly. Each runs as hubsync's ServiceAccount under
// deploy/'s RBAC, with its CPU profile served (server.pprof).
func startGatewayDaemons(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer, dir string,
	srv *konnectivity.Server, m *controlplane.Managed, msa, msaToken string) (*gatewayDaemons, error) {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	if err := hub.Namespace(ctx, gatewayCluster); err != nil {
		return nil, err
	}
	if err := hub.PutToken(ctx, gatewayCluster, msa, msaToken, map[string][]byte{"token": []byte(msaToken), "ca.crt": m.CA}); err != nil {
		return nil, err
	}
	if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: gatewayCluster, Labels: map[string]string{"gateway-bench": "yes"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := hub.UpdateCluster(ctx, gatewayCluster, func(mc *clusterv1.ManagedCluster) {
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	}); err != nil {
		return nil, err
	}
	asHubsync, err := hubsyncIdentity(ctx, cp)
	if err != nil {
		return nil, err
	}
	ca, certFile, keyFile, err := gatewayCert(dir, "bench-gateway-ca")
	if err != nil {
		return nil, err
	}
	out := &gatewayDaemons{ca: ca, certFile: certFile, keyFile: keyFile}
	type daemonSpec struct {
		transport, binary string
		into              *gatewayDaemon
	}
	specs := []daemonSpec{{config.TunnelKonnectivity, binary, &out.konnectivity}, {config.TunnelDirect, binary, &out.direct}}
	if gatewayBaseline != "" {
		specs = append(specs, daemonSpec{config.TunnelKonnectivity, gatewayBaseline, &out.baseline})
	}
	for _, spec := range specs {
		transport := spec.transport
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			out.stop()
			return nil, err
		}
		addrs := []string{ln.Addr().String()}
		_ = ln.Close()
		conf := config.Config{}
		conf.Tunnel = config.Tunnel{Enabled: true, Transport: transport, ManagedServiceAccount: msa,
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gateway-bench": "yes"}}}
		if transport == config.TunnelKonnectivity {
			conf.Tunnel.Konnectivity = srv.TunnelConfig(msa).Konnectivity
		}
		conf.Gateway = config.Gateway{Enabled: true, Listen: addrs[0], URL: "https://" + addrs[0], TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile}}
		conf.Server.Pprof = true
		d, err := fleet.StartDaemon(ctx, spec.binary, asHubsync, conf, logs)
		if err != nil {
			out.stop()
			return nil, err
		}
		*spec.into = gatewayDaemon{d: d, url: "https://" + addrs[0]}
		if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
			out.stop()
			return nil, fmt.Errorf("hubsync %s (%s): %w", spec.binary, transport, err)
		}
	}
	return out, nil
}

// gatewayGoal says whether the median of per-repeat figures meets a goal,
// and in how many repeats it was met.
func gatewayGoal(figures []float64, ok func(float64) bool) string {
	n := 0
	for _, f := range figures {
		if ok(f) {
			n++
		}
	}
	verdict := "NOT MET"
	if ok(median(sorted64(figures))) {
		verdict = "met"
	}
	return fmt.Sprintf("%s (%d of %d repeats)", verdict, n, len(figures))
}

func sorted64(f []float64) []float64 {
	s := slices.Clone(f)
	slices.Sort(s)
	return s
}

func floatSpread(f []float64, format string) string {
	s := sorted64(f)
	return fmt.Sprintf(format+" ["+format+"-"+format+"]", median(s), s[0], s[len(s)-1])
}

func percentSpread(f []float64) string {
	s := sorted64(f)
	return fmt.Sprintf("%.0f%% [%.0f-%.0f]", median(s), s[0], s[len(s)-1])
}

// applyGatewayRBAC applies the shipped deploy/gateway/managed-cluster-rbac.yaml
// and returns the ServiceAccount it grants impersonation to.
func applyGatewayRBAC(ctx context.Context, kube kubernetes.Interface) (namespace, name string, err error) {
	root, err := testutil.ModuleDir()
	if err != nil {
		return "", "", err
	}
	path := filepath.Join(root, "deploy", "gateway", "managed-cluster-rbac.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for _, into := range []any{&role, &binding} {
		if err := dec.Decode(into); err != nil {
			return "", "", fmt.Errorf("%s: %w", path, err)
		}
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != rbacv1.ServiceAccountKind {
		return "", "", fmt.Errorf("%s: want one ServiceAccount subject", path)
	}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", "", err
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", "", err
	}
	return binding.Subjects[0].Namespace, binding.Subjects[0].Name, nil
}

// grantGatewayReaders lets the prefixed hub user and the managed
// ServiceAccount sa read ConfigMaps in gatewayNS, and nothing else.
func grantGatewayReaders(ctx context.Context, kube kubernetes.Interface, user, sa string) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: gatewayNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}},
	}}
	if _, err := kube.RbacV1().Roles(gatewayNS).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: gatewayNS},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reader"},
		Subjects: []rbacv1.Subject{
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user},
			{Kind: rbacv1.ServiceAccountKind, Namespace: gatewayNS, Name: sa},
		}}
	if _, err := kube.RbacV1().RoleBindings(gatewayNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// createGatewayObjects writes the small ConfigMap and the large list's
// gatewayListSize ConfigMaps of about 1 KiB (random hex, which gzip halves)
// and returns the list's size in JSON.
func createGatewayObjects(ctx context.Context, kube kubernetes.Interface) (int64, error) {
	cms := kube.CoreV1().ConfigMaps(gatewayNS)
	small := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "small"}, Data: map[string]string{"key": "value"}}
	if _, err := cms.Create(ctx, small, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return 0, err
	}
	start := time.Now()
	if err := parallel(gatewayListSize, 32, func(i int) error {
		rng := rand.New(rand.NewPCG(uint64(i), 0x6761746577617921))
		raw := make([]byte, 512)
		for j := range raw {
			raw[j] = byte(rng.Uint32())
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("item-%04d", i)}, Data: map[string]string{"data": hex.EncodeToString(raw)}}
		_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		return err
	}); err != nil {
		return 0, err
	}
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath(gatewayListPath).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	fmt.Printf("created %d ConfigMaps of 1 KiB on the managed cluster in %s\n", gatewayListSize, time.Since(start).Round(time.Millisecond))
	return int64(len(raw)), nil
}

// wireBytes GETs path through mode accepting gzip, and returns the bytes
// on the wire and their Content-Encoding.
func wireBytes(ctx context.Context, md gatewayMode, path string) (int64, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, md.base+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header = md.header.Clone()
	req.Header.Set("Accept-Encoding", "gzip") // set explicitly: the transport leaves the body compressed
	resp, err := md.rt.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: GET %s: %s", md.name, path, resp.Status)
	}
	enc := resp.Header.Get("Content-Encoding")
	if enc == "" {
		enc = "uncompressed"
	}
	return n, enc, err
}

// whoAmI asks the API server, through mode, who the request is.
func whoAmI(ctx context.Context, md gatewayMode) (string, error) {
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, md.base+"/apis/authentication.k8s.io/v1/selfsubjectreviews", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header = md.header.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := md.rt.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("%s: SelfSubjectReview: %w", md.name, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: SelfSubjectReview: %s: %s", md.name, resp.Status, data)
	}
	var review authenticationv1.SelfSubjectReview
	if err := json.Unmarshal(data, &review); err != nil {
		return "", err
	}
	u := review.Status.UserInfo
	return fmt.Sprintf("%s, groups %s (%s)", u.Username, strings.Join(u.Groups, ", "), resp.Proto), nil
}

// gatewayCert makes a CA named name and a serving certificate for
// 127.0.0.1 in dir, for a gateway on loopback.
func gatewayCert(dir, name string) (*pki.CA, string, string, error) {
	ca, err := pki.NewCA(name)
	if err != nil {
		return nil, "", "", err
	}
	pair, err := ca.Serving("127.0.0.1")
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile, err := pair.Write(dir, "gateway")
	return ca, certFile, keyFile, err
}
