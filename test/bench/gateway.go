package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
	"github.com/hubsync/hubsync/tunnel"
)

// Gateway figures (flags).
var (
	gatewayOnly       bool
	gatewayRepeats    int
	gatewayRequests   int
	gatewayLists      int
	gatewayCPUProfile string
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

// countingReviewer counts the TokenReviews the gateways send to the hub.
type countingReviewer struct {
	gateway.Reviewer
	n atomic.Int64
}

func (c *countingReviewer) Review(ctx context.Context, token string) (gateway.Identity, bool, error) {
	c.n.Add(1)
	return c.Reviewer.Review(ctx, token)
}

// benchGateway measures, against a real konnectivity proxy-server, agent
// and managed kube-apiserver and the hub's TokenReview, a small GET's
// p50/p99 and a large list's throughput through the access gateway
// against the same requests sent straight to the managed API server, and
// through a gateway whose pool dials the API server directly, which
// separates the gateway's own cost from konnectivity's.
func benchGateway(ctx context.Context, cp *controlplane.ControlPlane) error {
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
	reviewer := &countingReviewer{Reviewer: gateway.TokenReviewer{Kube: hub}}
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

	// Two pools: through konnectivity, and dialing the API server
	// directly.
	kd, err := tunnel.NewKonnectivityDialer(tunnel.KonnectivityConfig{
		Address: srv.ClientAddress, CAFile: srv.CAFile, CertFile: srv.CertFile, KeyFile: srv.KeyFile,
	})
	if err != nil {
		return err
	}
	target := tunnel.Target{Address: m.Address, ServerName: tunnel.DefaultKonnectivityServerName, CA: m.CA, Token: msaToken}
	pool, stopPool, err := startGatewayPool(ctx, kd, tunnel.TransportKonnectivity, target)
	if err != nil {
		return err
	}
	defer stopPool()
	directPool, stopDirectPool, err := startGatewayPool(ctx, &tunnel.DirectDialer{}, tunnel.TransportDirect, target)
	if err != nil {
		return err
	}
	defer stopDirectPool()

	// A gateway over each, served over TLS as the daemon serves it.
	ca, certFile, keyFile, err := gatewayCert(dir, "bench-gateway-ca")
	if err != nil {
		return err
	}
	certs, err := gateway.NewFileCert(certFile, keyFile, nil)
	if err != nil {
		return err
	}
	keys := &gateway.KeySet{Fetch: func(ctx context.Context) ([]byte, error) {
		return hub.CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}}
	gwURL, gwReg, stopGW, err := serveGateway(ctx, pool, reviewer, keys, certs)
	if err != nil {
		return err
	}
	defer stopGW()
	gwDirectURL, gwDirectReg, stopGWDirect, err := serveGateway(ctx, directPool, reviewer, keys, certs)
	if err != nil {
		return err
	}
	defer stopGWDirect()

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
		{"gateway", gwURL + "/" + gatewayCluster, gwClient, bearer(hubToken)},
		{"gateway, direct dialer", gwDirectURL + "/" + gatewayCluster, gwDirectClient, bearer(hubToken)},
		{"direct, impersonating", "https://" + m.Address, impClient, impHeader},
	}
	const direct, gw, gwDirect, imp = 0, 1, 2, 3

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

	if gatewayCPUProfile != "" {
		f, err := os.Create(gatewayCPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	// What every process uses idle, over the same clock as the figures
	// below: per request, the CPU figures include it for the request's
	// share of wall time (more in slower modes).
	idle0, idleStart := gatewayCPU(), time.Now()
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	idle1, idleWall := gatewayCPU(), time.Since(idleStart)
	fmt.Print("CPU used idle, ms per second:")
	for _, r := range gatewayRoles {
		fmt.Printf(" %s %.0f;", r, float64(idle1[r]-idle0[r])/float64(time.Millisecond)/idleWall.Seconds())
	}
	fmt.Println()

	// Small GETs.
	goalSmall := map[int][]float64{}
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
		var gw50, gw99, gwd50, gwd99, imp50, konn50 []float64
		cpu := newCPUTally(len(modes))
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
		}
		goalSmall[conc] = gw50
		fmt.Printf("concurrency %d (median over %d repeats, range in brackets):\n", conc, gatewayRepeats)
		for i, md := range modes {
			fmt.Printf("  %-22s p50 %s  p99 %s\n", md.name, durSpread(p50s[i]), durSpread(p99s[i]))
		}
		goal := ""
		if conc == 32 {
			goal = " (goal <= 1.30x: " + gatewayGoal(gw50, func(r float64) bool { return r <= 1.3 }) + ")"
		}
		fmt.Printf("  gateway / direct:                p50 %s%s  p99 %s\n", ratioSpread(gw50), goal, ratioSpread(gw99))
		fmt.Printf("  gateway, direct dialer / direct: p50 %s  p99 %s (the gateway without konnectivity)\n", ratioSpread(gwd50), ratioSpread(gwd99))
		fmt.Printf("  gateway / gateway, direct dialer: p50 %s (konnectivity's relays); direct, impersonating / direct: p50 %s (the API server's impersonation checks)\n",
			ratioSpread(konn50), ratioSpread(imp50))
		cpu.print(modes, time.Microsecond, "µs")
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
		cpu := newCPUTally(len(modes))
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
		goalList[conc] = gwPct
		fmt.Printf("concurrency %d (median over %d repeats, range in brackets):\n", conc, gatewayRepeats)
		for i, md := range modes {
			fmt.Printf("  %-22s %s MB/s  %s lists/s  list p50 %s\n", md.name, floatSpread(mbps[i], "%.1f"), floatSpread(rate[i], "%.1f"), durSpread(p50s[i]))
		}
		fmt.Printf("  gateway / direct throughput: %s (goal >= 80%%: %s)\n", percentSpread(gwPct), gatewayGoal(gwPct, func(p float64) bool { return p >= 80 }))
		fmt.Printf("  gateway, direct dialer / direct: %s; direct, impersonating / direct: %s\n", percentSpread(gwdPct), percentSpread(impPct))
		cpu.print(modes, time.Millisecond, "ms")
	}
	if gatewayCPUProfile != "" {
		pprof.StopCPUProfile()
		fmt.Printf("CPU profile of the bench process (clients and gateways) during the measurements: %s\n", gatewayCPUProfile)
	}

	hits := metricSum(gwReg, "hubsync_gateway_token_review_cache_hits_total", nil) + metricSum(gwDirectReg, "hubsync_gateway_token_review_cache_hits_total", nil)
	authenticated := metricSum(gwReg, "hubsync_gateway_token_reviews_total", testutil.Labels{"result": "authenticated"}) +
		metricSum(gwDirectReg, "hubsync_gateway_token_reviews_total", testutil.Labels{"result": "authenticated"})
	fmt.Printf("TokenReview: %.0f gateway requests authenticated, %.0f from the cache (hubsync_gateway_token_review_cache_hits_total), %d TokenReviews sent to the hub\n",
		authenticated, hits, reviewer.n.Load())
	fmt.Println("gateway goals in this run (median over repeats; repeats meeting the goal):")
	fmt.Printf("  small GET p50 at concurrency 32, gateway / direct: %s, goal <= 1.30x: %s\n",
		ratioSpread(goalSmall[32]), gatewayGoal(goalSmall[32], func(r float64) bool { return r <= 1.3 }))
	for _, conc := range []int{1, 4} {
		fmt.Printf("  large LIST throughput at concurrency %d, gateway / direct: %s, goal >= 80%%: %s\n",
			conc, percentSpread(goalList[conc]), gatewayGoal(goalList[conc], func(p float64) bool { return p >= 80 }))
	}
	return nil
}

// The processes whose CPU time the gateway figures break down, in the
// order printed.
var gatewayRoles = []string{"bench", "managed kube-apiserver", "etcd", "proxy-server", "proxy-agent", "hub kube-apiserver"}

// gatewayCPU is the CPU time used so far by this process (the clients and
// the gateways) and by its children, by role. /proc counts in 10ms ticks:
// the figures are summed over every repeat before they are divided.
func gatewayCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	if c, err := fleet.ProcessCPUTime(os.Getpid()); err == nil {
		out["bench"] = c
	}
	for _, c := range children() {
		role := c.name
		switch {
		case role == "kube-apiserver":
			role = "hub kube-apiserver"
			if cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.pid), "cmdline")); bytes.Contains(cmd, []byte("--bind-address="+gatewayIP)) {
				role = "managed kube-apiserver"
			}
		case !slices.Contains(gatewayRoles, role):
			continue
		}
		if cpu, err := fleet.ProcessCPUTime(c.pid); err == nil {
			out[role] += cpu
		}
	}
	return out
}

// cpuTally sums, per mode, the CPU time each role used during the timed
// runs, and the requests they made.
type cpuTally struct {
	cpu      []map[string]time.Duration
	requests []int
}

func newCPUTally(modes int) *cpuTally {
	t := &cpuTally{cpu: make([]map[string]time.Duration, modes), requests: make([]int, modes)}
	for i := range t.cpu {
		t.cpu[i] = map[string]time.Duration{}
	}
	return t
}

// measure runs f, a timed run of n requests of mode i, and adds the CPU
// time each role used meanwhile.
func (t *cpuTally) measure(i, n int, f func() error) error {
	before := gatewayCPU()
	if err := f(); err != nil {
		return err
	}
	for role, c := range gatewayCPU() {
		t.cpu[i][role] += c - before[role]
	}
	t.requests[i] += n
	return nil
}

// print writes the CPU time per request by role, in unit.
func (t *cpuTally) print(modes []gatewayMode, unit time.Duration, unitName string) {
	fmt.Printf("  CPU per request in %s, by process, over every repeat (bench: this process, the clients and the gateways):\n    %-22s", unitName, "")
	for _, r := range gatewayRoles {
		fmt.Printf("  %s", r)
	}
	fmt.Println("   total")
	for i, md := range modes {
		per := func(d time.Duration) float64 { return float64(d) / float64(unit) / float64(t.requests[i]) }
		fmt.Printf("    %-22s", md.name)
		var total time.Duration
		for _, r := range gatewayRoles {
			fmt.Printf("  %*.0f", len(r), per(t.cpu[i][r]))
			total += t.cpu[i][r]
		}
		fmt.Printf("  %6.0f\n", per(total))
	}
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

// metricSum adds the samples of the named metric in reg that carry
// labels (nil: all of them); 0 when reg cannot be read.
func metricSum(reg prometheus.Gatherer, name string, labels testutil.Labels) float64 {
	m, err := testutil.Gather(reg)
	if err != nil {
		return 0
	}
	return m.Value(name, labels)
}

// startGatewayPool starts a pool that serves the bench's cluster at target
// through d, and waits until it is ready.
func startGatewayPool(ctx context.Context, d tunnel.Dialer, transport string, target tunnel.Target) (*tunnel.Pool, func(), error) {
	opts := tunnel.OptionsFor(config.Default().Tunnel)
	opts.Dialer, opts.Transport = d, transport
	p, err := tunnel.New(opts)
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	p.Start(pctx)
	stop := func() { cancel(); p.Close() }
	p.SetTarget(gatewayCluster, &target)
	p.SetSelected(gatewayCluster, true)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := p.WaitReady(wctx, gatewayCluster); err != nil {
		stop()
		return nil, nil, fmt.Errorf("%s pool: %w", transport, err)
	}
	return p, stop, nil
}

// serveGateway serves a gateway over pool on 127.0.0.1, configured as the
// daemon's defaults configure it, with its metrics in a registry of its
// own.
func serveGateway(ctx context.Context, pool *tunnel.Pool, reviewer gateway.Reviewer, keys *gateway.KeySet, certs gateway.CertSource) (string, *prometheus.Registry, func(), error) {
	gc := config.Default().Gateway
	reg := prometheus.NewRegistry()
	opts := gateway.OptionsFor(gc)
	opts.Pool, opts.Reviewer, opts.HubKeys, opts.Registerer = pool, reviewer, keys, reg
	g, err := gateway.New(opts)
	if err != nil {
		return "", nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		so := gateway.ServerOptionsFor(gc)
		so.Certs = certs
		errc <- gateway.Serve(sctx, ln, g, so)
	}()
	stop := func() {
		cancel()
		if err := <-errc; err != nil {
			fmt.Fprintln(os.Stderr, "bench: gateway:", err)
		}
	}
	return "https://" + ln.Addr().String(), reg, stop, nil
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
