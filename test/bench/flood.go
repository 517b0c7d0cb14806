package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// Flood figures (flags).
var (
	floodOnly     bool
	floodRepeats  int
	floodRequests int
	floodConns    int
	floodBurst    int
)

const (
	// floodIP is the managed API server's address; floodAttacker is the
	// flood's source address, another host than the legitimate client's.
	floodIP       = "127.0.0.24"
	floodAttacker = "127.0.0.3"
	floodCluster  = "bench-flood"
	floodSet      = "flood-burst"
	// floodAgent is the forged requests' User-Agent, by which the managed
	// API server's audit log tells them apart.
	floodAgent = "hubsync-bench-flood"
	// floodNamespaces hold the burst's profiles.
	floodNamespaces = 2
	// floodCostGoal bounds hub TokenReviews plus requests reaching the
	// cluster, per forged request; floodBurstGoal bounds the burst's
	// convergence under the flood against a quiet run's;
	// floodSettleGoal bounds how long hubsync's goroutines and open
	// files take to come back to where they were after a flood.
	floodCostGoal   = 0.10
	floodBurstGoal  = 1.2
	floodSettleGoal = 10 * time.Second
)

// floodPhase is what one run measured.
type floodPhase struct {
	// kind is the flood's (kinds' index), or the one the quiet run is
	// paired with.
	kind    int
	flooded bool
	// The flood.
	took    time.Duration
	codes   map[int]int
	reviews float64
	reached int
	// The legitimate client.
	lat      []time.Duration
	errs     int
	firstErr error // the first of errs, printed so a failing run says why
	// The syncer's burst.
	converge time.Duration
	// sharedDials are the pool's dials of shared connections during the
	// run: a cluster that closed its connection (GOAWAY) is redialed.
	sharedDials float64
	// trace is hubsync's goroutines and open files from the flood's end
	// (a quiet run's: from floodQuietOffset) for floodSettleGoal.
	trace []resourceSample
}

// floodSlack is how far above where they were before a run hubsync's
// goroutines and open files may be and count as back.
const floodSlack = 20

// benchFlood runs the real daemon, as its ServiceAccount under the
// shipped RBAC and deploy/gateway/flowcontrol.yaml, with the gateway over
// a real konnectivity proxy-server, agent and managed kube-apiserver. In
// each run a legitimate client reads one object through the gateway
// while the syncer converges a burst of profiles; in every other run a
// flood of forged tokens (half opaque, half self-signed JWTs, every one
// new) hits the gateway from another address at the same time. It prints
// what the flood cost (hub TokenReviews, requests reaching the cluster)
// and what it did to the legitimate client and to the burst, against the
// quiet runs measured alternately in the same conditions.
func benchFlood(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) error {
	fmt.Printf("\n== strangers: five floods at the gateway, from another address, each beside a legitimate client and while the syncer converges a burst of %d profiles (%d repeats)\n",
		floodBurst*floodNamespaces, floodRepeats)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := startReach(ctx, cp, floodCluster, floodIP)
	if err != nil {
		return err
	}
	defer r.stop()
	dir, srv, m := r.dir, r.server, r.managed
	mg, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		return err
	}
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return err
	}

	// The managed side: the impersonating MSA as shipped, and an object
	// the prefixed hub identity may read.
	msaNS, msa, err := applyGatewayRBAC(ctx, mg)
	if err != nil {
		return err
	}
	msaToken, err := m.ServiceAccountToken(ctx, msaNS, msa, 2*time.Hour)
	if err != nil {
		return err
	}
	userToken, id, err := benchHubIdentity(ctx, hub.Kube)
	if err != nil {
		return err
	}
	if _, err := m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour); err != nil {
		return err
	}
	if err := grantGatewayReaders(ctx, mg, gateway.ImpersonatedUser(id), "direct-reader"); err != nil {
		return err
	}
	small := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "small"}, Data: map[string]string{"key": "value"}}
	if _, err := mg.CoreV1().ConfigMaps(gatewayNS).Create(ctx, small, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	// The hub side: the cluster with its MSA token, the burst's set bound
	// in its namespaces, and hubsync's identity as deploy/ ships it.
	if err := hub.Namespace(ctx, floodCluster); err != nil {
		return err
	}
	if err := hub.PutToken(ctx, floodCluster, msa, msaToken, map[string][]byte{"token": []byte(msaToken), "ca.crt": m.CA}); err != nil {
		return err
	}
	if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: floodCluster, Labels: map[string]string{"flood-bench": "gateway"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := hub.UpdateCluster(ctx, floodCluster, func(mc *clusterv1.ManagedCluster) {
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + m.Address, CABundle: m.CA}}
	}); err != nil {
		return err
	}
	// A served cluster whose keys cannot be fetched: no agent, no token.
	if err := hub.Namespace(ctx, floodDark); err != nil {
		return err
	}
	if _, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: floodDark, Labels: map[string]string{"flood-bench": "gateway"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := hub.CreateExclusiveSet(ctx, floodSet); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for i := range floodNamespaces {
		ns := fmt.Sprintf("flood-ns-%d", i)
		if err := hub.Namespace(ctx, ns); err != nil {
			return err
		}
		if err := hub.Bind(ctx, ns, floodSet, true); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	asHubsync, err := hubsyncIdentity(ctx, cp)
	if err != nil {
		return err
	}

	// The gateway's serving certificate and hubsync's configuration.
	ca, certFile, keyFile, err := gatewayCert(dir, "bench-flood-ca")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	conf := config.Config{}
	conf.Tunnel = srv.TunnelConfig(msa)
	conf.Tunnel.ClusterSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"flood-bench": "gateway"}}
	conf.Gateway = config.Gateway{Enabled: true, Listen: addr, URL: "https://" + addr, TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile}}
	d, err := fleet.StartDaemon(ctx, binary, asHubsync, conf, logs)
	if err != nil {
		return err
	}
	defer func() { _ = d.Stop() }()
	if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	legit := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	defer legit.CloseIdleConnections()
	url := "https://" + addr + "/" + floodCluster + gatewaySmallPath
	get := func(ctx context.Context) (time.Duration, error) { return timedGet(ctx, legit, url, userToken) }
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := get(ctx)
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("the gateway does not serve the legitimate client: %w", err)
	}

	known, err := m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", 2*time.Hour)
	if err != nil {
		return err
	}
	side := floodSide{hub: hub, d: d, m: m}
	if err := floodRuns(ctx, side, floodKinds(floodTarget{addr: addr, roots: roots, m: m}, known), get); err != nil {
		return err
	}
	return firstRequests(ctx, side, legit, url)
}

// timedGet GETs url through tr with token, and says how long the answer
// took; an answer other than 200 is an error.
func timedGet(ctx context.Context, tr http.RoundTripper, url, token string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s", resp.Status)
	}
	return time.Since(start), nil
}

// firstRequestTokens is how many new tokens each repeat of firstRequests
// sends.
const firstRequestTokens = 30

// firstRequests measures what the trials cost a legitimate client: the
// first request with a token the cluster has not accepted yet goes on a
// connection of its own (a dial through konnectivity), the next ones on
// the connection the cluster's clients share. Each new token (of a
// ServiceAccount the cluster lets read) is sent twice in a row, over the
// client's open connection to the gateway; the figures are the first
// request's latency against the second's, and the dials per first
// request.
func firstRequests(ctx context.Context, side floodSide, client http.RoundTripper, url string) error {
	fmt.Printf("-- a legitimate client's first request with a new pass-through token (a trial, on a connection of its own), against its second (the shared connection): %d new tokens per repeat, %d repeats\n",
		firstRequestTokens, floodRepeats)
	var firstP50, secondP50, ratio, extra, dialsPer []float64
	for range floodRepeats {
		tokens := make([]string, firstRequestTokens)
		if err := parallel(len(tokens), 8, func(i int) (err error) {
			tokens[i], err = side.m.ServiceAccountToken(ctx, gatewayNS, "direct-reader", time.Hour)
			return err
		}); err != nil {
			return err
		}
		before, err := side.d.Scrape()
		if err != nil {
			return err
		}
		var first, second, added []time.Duration
		for _, tok := range tokens {
			f, err := timedGet(ctx, client, url, tok)
			if err != nil {
				return fmt.Errorf("a new token's first request: %w", err)
			}
			s, err := timedGet(ctx, client, url, tok)
			if err != nil {
				return fmt.Errorf("a new token's second request: %w", err)
			}
			first, second, added = append(first, f), append(second, s), append(added, f-s)
		}
		after, err := side.d.Scrape()
		if err != nil {
			return err
		}
		delta := func(name string, l testutil.Labels) float64 { return after.Value(name, l) - before.Value(name, l) }
		if n := delta("hubsync_gateway_trials_total", testutil.Labels{"result": "accepted"}); n != firstRequestTokens {
			return fmt.Errorf("%.0f trials accepted; want %d (one per new token)", n, firstRequestTokens)
		}
		slices.Sort(first)
		slices.Sort(second)
		slices.Sort(added)
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		firstP50 = append(firstP50, ms(median(first)))
		secondP50 = append(secondP50, ms(median(second)))
		ratio = append(ratio, float64(median(first))/float64(median(second)))
		extra = append(extra, ms(median(added)))
		dialsPer = append(dialsPer, delta("hubsync_tunnel_upgrade_dials_total", testutil.Labels{"result": "ok"})/firstRequestTokens)
		fmt.Printf("   first p50 %.1f ms p90 %.1f ms; second p50 %.1f ms p90 %.1f ms\n",
			ms(median(first)), ms(percentile(first, 90)), ms(median(second)), ms(percentile(second, 90)))
	}
	fmt.Printf("   first request p50: %s ms; second: %s ms; first / second: %sx; added by the trial (per token, p50): %s ms; dials per first request: %s\n",
		floatSpread(firstP50, "%.1f"), floatSpread(secondP50, "%.1f"), floatSpread(ratio, "%.2f"), floatSpread(extra, "%.1f"), floatSpread(dialsPer, "%.2f"))
	return nil
}

// floodRuns runs every flood beside a quiet run, floodRepeats times, the
// quiet one first in every other repeat, and prints the figures.
func floodRuns(ctx context.Context, side floodSide, kinds []floodKind, get func(context.Context) (time.Duration, error)) error {
	var phases []floodPhase
	for r := range floodRepeats {
		for k := range kinds {
			for _, flooded := range [][]bool{{false, true}, {true, false}}[r%2] {
				var send func(context.Context) (time.Duration, map[int]int)
				if flooded {
					var err error
					if send, err = kinds[k].prepare(ctx); err != nil {
						return fmt.Errorf("%s: %w", kinds[k].name, err)
					}
				}
				p, err := floodRun(ctx, side, get, send)
				if err != nil {
					return err
				}
				p.kind = k
				phases = append(phases, p)
				p.print(kinds)
			}
		}
	}
	printFloodSummary(phases, kinds)
	return nil
}

// floodSide is what the floods cost: the hub, the daemon and the
// managed cluster.
type floodSide struct {
	hub *fleet.Hub
	d   *fleet.Daemon
	m   *controlplane.Managed
}

// floodRun measures one run: the burst and the legitimate client, and
// the flood send when it is not nil.
func floodRun(ctx context.Context, side floodSide, get func(context.Context) (time.Duration, error),
	send func(context.Context) (time.Duration, map[int]int)) (floodPhase, error) {
	hub := side.hub
	p := floodPhase{flooded: send != nil, codes: map[int]int{}}
	before, err := floodCounts(side)
	if err != nil {
		return p, err
	}
	stop := make(chan struct{})
	legitDone := legitimateClient(ctx, get, stop, &p)
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		if send != nil {
			p.took, p.codes = send(ctx)
		} else {
			// The quiet run is read from about when a flood ends.
			select {
			case <-ctx.Done():
			case <-time.After(floodQuietOffset):
			}
		}
		p.trace = resourceTrace(ctx, side)
	}()
	start := time.Now()
	names := make([]string, floodBurst)
	for i := range names {
		names[i] = fmt.Sprintf("flood-c%04d", i)
	}
	err = parallel(len(names), 16, func(i int) error {
		_, err := hub.CreateCluster(ctx, fleet.ClusterSpec{Name: names[i], Labels: fleet.ExclusiveSetLabels(floodSet, nil)})
		return err
	})
	if err == nil {
		err = waitProfiles(ctx, hub, floodBurst)
	}
	p.converge = time.Since(start)
	<-floodDone
	close(stop)
	<-legitDone
	if err != nil {
		return p, fmt.Errorf("burst: %w", err)
	}
	if err := p.measure(side, before); err != nil {
		return p, err
	}
	slices.Sort(p.lat)
	// The fleet as it was, for the next run.
	if err := parallel(len(names), 16, func(i int) error { return hub.DeleteCluster(ctx, names[i]) }); err != nil {
		return p, err
	}
	return p, waitProfiles(ctx, hub, 0)
}

// legitimateClient reads with get from two goroutines until stop closes,
// recording into p; the returned channel closes once both have ended.
func legitimateClient(ctx context.Context, get func(context.Context) (time.Duration, error), stop <-chan struct{}, p *floodPhase) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				took, err := get(ctx)
				mu.Lock()
				if err != nil {
					if p.errs++; p.firstErr == nil {
						p.firstErr = err
					}
				} else {
					p.lat = append(p.lat, took)
				}
				mu.Unlock()
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// floodCount is what a run's cost is read from: the hub TokenReviews and
// the shared connections the daemon made, and the requests the cluster's
// audit log holds.
type floodCount struct {
	reviews, sharedDials float64
	reached              int
}

func floodCounts(side floodSide) (floodCount, error) {
	var c floodCount
	m, err := side.d.Scrape()
	if err != nil {
		return c, err
	}
	c.reviews = hubReviews(m)
	c.sharedDials = m.Value("hubsync_tunnel_dials_total", testutil.Labels{"result": "ok"})
	c.reached, err = floodReached(side.m)
	return c, err
}

// floodQuietOffset is when a quiet run's resources are read from, about
// when a flood ends.
const floodQuietOffset = 700 * time.Millisecond

// resourceSample is hubsync's goroutines and open files at one moment.
type resourceSample struct {
	goroutines float64
	files      int
}

// resourceTrace reads hubsync's goroutines and open files every 100 ms for
// floodSettleGoal, while the burst goes on.
func resourceTrace(ctx context.Context, side floodSide) []resourceSample {
	var out []resourceSample
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	end := time.After(floodSettleGoal)
	for {
		var r resourceSample
		if m, err := side.d.Scrape(); err == nil {
			r.goroutines = m.Value("go_goroutines", nil)
		}
		r.files, _ = side.d.OpenFiles()
		out = append(out, r)
		select {
		case <-ctx.Done():
			return out
		case <-end:
			return out
		case <-tick.C:
		}
	}
}

// settle is how long after the flood's end hubsync's goroutines and open
// files came back within floodSlack of the quiet run's at the same
// moment of its burst, -1 if not within floodSettleGoal; and where they
// were at the flood's end.
func settle(quiet, flooded []resourceSample) (time.Duration, string) {
	if len(quiet) == 0 || len(flooded) == 0 {
		return -1, "not read"
	}
	at := fmt.Sprintf("goroutines %.0f (quiet %.0f), files %d (quiet %d) at the flood's end",
		flooded[0].goroutines, quiet[0].goroutines, flooded[0].files, quiet[0].files)
	for i := range min(len(quiet), len(flooded)) {
		if flooded[i].goroutines <= quiet[i].goroutines+floodSlack && flooded[i].files <= quiet[i].files+floodSlack {
			return time.Duration(i) * 100 * time.Millisecond, at
		}
	}
	return -1, at
}

// measure reads the run's cost against before.
func (p *floodPhase) measure(side floodSide, before floodCount) error {
	after, err := floodCounts(side)
	if err != nil {
		return err
	}
	p.reviews = after.reviews - before.reviews
	p.reached = after.reached - before.reached
	p.sharedDials = after.sharedDials - before.sharedDials
	return nil
}

// forgedTokens are n new tokens: half opaque strings (none with
// jwtOnly), half JWTs for the cluster's issuer signed with keys of the
// forger's own (each with a key id of its own, so that each names a key
// nobody knows).
func forgedTokens(n int, issuer string, jwtOnly bool) ([]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i := range out {
		if i%2 == 0 && !jwtOnly {
			out[i] = rand.Text() + rand.Text()
			continue
		}
		claims := map[string]any{"iss": issuer, "aud": []string{issuer}, "exp": time.Now().Add(time.Hour).Unix(),
			"sub": fmt.Sprintf("system:serviceaccount:kube-system:forged-%d", i)}
		if out[i], err = pki.SignJWT(key, rand.Text(), claims); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hubReviews is the TokenReviews the daemon's gateway sent the hub.
func hubReviews(metrics testutil.Metrics) float64 {
	sum := 0.0
	for _, r := range []string{"authenticated", "unauthenticated", "error"} {
		sum += metrics.Value("hubsync_gateway_token_reviews_total", testutil.Labels{"result": r})
	}
	return sum
}

// floodReached counts the forged requests in the managed API server's
// audit log, whatever the stage (a failed authentication is audited at
// ResponseStarted only), each once.
func floodReached(m *controlplane.Managed) (int, error) {
	log, err := m.AuditLog()
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"userAgent":"`+floodAgent+`"`) {
			continue
		}
		var e struct {
			AuditID string `json:"auditID"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return 0, fmt.Errorf("audit log line: %w", err)
		}
		seen[e.AuditID] = true
	}
	return len(seen), nil
}

// waitProfiles waits until each burst namespace holds want profiles.
func waitProfiles(ctx context.Context, hub *fleet.Hub, want int) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		for i := range floodNamespaces {
			names, err := hub.ProfileNames(ctx, fmt.Sprintf("flood-ns-%d", i))
			if err != nil || len(names) != want {
				return false, nil
			}
		}
		return true, nil
	})
}

// benchHubIdentity is the gateway clients' hub ServiceAccount
// (gatewayNS/reader), a token of it and what the hub's TokenReview says it
// is.
func benchHubIdentity(ctx context.Context, kube kubernetes.Interface) (string, gateway.Identity, error) {
	for _, create := range []func() error{
		func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gatewayNS}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().ServiceAccounts(gatewayNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", gateway.Identity{}, err
		}
	}
	secs := int64(7200)
	tr, err := kube.CoreV1().ServiceAccounts(gatewayNS).CreateToken(ctx, "reader",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return "", gateway.Identity{}, err
	}
	id, ok, err := (gateway.TokenReviewer{Kube: kube}).Review(ctx, tr.Status.Token)
	if err != nil || !ok {
		return "", gateway.Identity{}, fmt.Errorf("the hub does not authenticate its own ServiceAccount token: %v", err)
	}
	return tr.Status.Token, id, nil
}

// hubsyncIdentity applies deploy/'s ServiceAccount, RBAC and the
// gateway's hub RBAC and flow control with the real kubectl, and returns
// a client configuration that acts as that ServiceAccount, so that the
// hub's Priority and Fairness classifies hubsync's requests as in a
// deployment (an admin would be exempt).
func hubsyncIdentity(ctx context.Context, cp *controlplane.ControlPlane) (*rest.Config, error) {
	kubectl, err := controlplane.KubectlPath()
	if err != nil {
		return nil, err
	}
	root, err := testutil.ModuleDir()
	if err != nil {
		return nil, err
	}
	deploy := filepath.Join(root, "deploy")
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	const ns, sa = "open-cluster-management-hub", "hubsync"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hubsync-bench-kubectl-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := fleet.WriteKubeconfig(cp.Config, admin); err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", admin, "apply"}
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml", "gateway/hub-rbac.yaml", "gateway/flowcontrol.yaml"} {
		args = append(args, "-f", filepath.Join(deploy, f))
	}
	if out, err := exec.CommandContext(ctx, kubectl, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	secs := int64(7200)
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

func (p floodPhase) print(kinds []floodKind) {
	kind := "quiet  "
	flood := ""
	if p.flooded {
		kind = "flooded"
		flood = fmt.Sprintf("; flood (%s) in %s: %s, %.0f hub TokenReviews, %d reached the cluster, %.0f shared connections dialed",
			kinds[p.kind].name, p.took.Round(time.Millisecond), codeList(p.codes), p.reviews, p.reached, p.sharedDials)
	}
	if p.firstErr != nil {
		flood += fmt.Sprintf("; the first error: %v", p.firstErr)
	}
	fmt.Printf("%s: burst converged in %s; legitimate client %d GETs, p50 %s p99 %s, %d errors%s\n",
		kind, p.converge.Round(time.Millisecond), len(p.lat), floodPct(p.lat, 50), floodPct(p.lat, 99), p.errs, flood)
}

func codeList(codes map[int]int) string {
	var keys []int
	for k := range codes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%d", codes[k], k))
	}
	return strings.Join(parts, " ")
}

// printFloodSummary compares each flooded run with the quiet run next to
// it, and prints, per flood, the medians and ranges against the goals.
func printFloodSummary(phases []floodPhase, kinds []floodKind) {
	for k, kind := range kinds {
		var pairs [][2]floodPhase
		for i := 0; i+1 < len(phases); i += 2 {
			q, f := phases[i], phases[i+1]
			if q.flooded {
				q, f = f, q
			}
			if f.kind == k {
				pairs = append(pairs, [2]floodPhase{q, f})
			}
		}
		fmt.Printf("-- %d × %s\n", kind.requests, kind.name)
		printFloodPairs(pairs, kind.requests)
	}
}

// printFloodPairs prints one flood's figures over its (quiet, flooded)
// pairs.
func printFloodPairs(pairs [][2]floodPhase, requests int) {
	var cost, burst, p99Quiet, p99Flood, dials, settled []float64
	var ats []string
	errs, met := 0, 0
	for _, pair := range pairs {
		q, f := pair[0], pair[1]
		cost = append(cost, 100*(f.reviews+float64(f.reached))/float64(requests))
		burst = append(burst, f.converge.Seconds()/q.converge.Seconds())
		pq, pf := floodPct(q.lat, 99), floodPct(f.lat, 99)
		p99Quiet = append(p99Quiet, float64(pq)/float64(time.Millisecond))
		p99Flood = append(p99Flood, float64(pf)/float64(time.Millisecond))
		dials = append(dials, f.sharedDials)
		d, at := settle(q.trace, f.trace)
		s := floodSettleGoal.Seconds() + 1 // not within the goal
		if d >= 0 {
			s = d.Seconds()
		}
		settled = append(settled, s)
		ats = append(ats, at)
		errs += f.errs + q.errs
		if pf <= max(3*pq, pq+50*time.Millisecond) {
			met++
		}
	}
	fmt.Printf("   cost (hub TokenReviews + requests reaching the cluster, per request of the flood): %s; goal <= %.0f%%: %s\n",
		floatSpread(cost, "%.1f%%"), 100*floodCostGoal, gatewayGoal(cost, func(v float64) bool { return v <= 100*floodCostGoal }))
	verdict := "met"
	if errs > 0 || met < len(p99Flood) {
		verdict = "NOT MET"
	}
	fmt.Printf("   legitimate client on the same cluster: %d errors; p99 quiet %s ms, flooded %s ms; goal 0 errors and p99 <= max(3x, +50 ms) of the quiet run next to it: %s (%d of %d pairs)\n",
		errs, floatSpread(p99Quiet, "%.1f"), floatSpread(p99Flood, "%.1f"), verdict, met, len(p99Flood))
	fmt.Printf("   shared connections dialed during the flood (a cluster's GOAWAY): %s; goal 0: %s\n",
		floatSpread(dials, "%.0f"), gatewayGoal(dials, func(v float64) bool { return v == 0 }))
	fmt.Printf("   hubsync's goroutines and open files back within %d of the quiet run's at the same moment of its burst, after the flood's end: %s s (%s); goal <= %s: %s\n",
		floodSlack, floatSpread(settled, "%.1f"), strings.Join(ats, "; "), floodSettleGoal, gatewayGoal(settled, func(v float64) bool { return v <= floodSettleGoal.Seconds() }))
	fmt.Printf("   syncer burst (%d profiles) convergence, flooded / quiet: %sx; goal <= %.1fx: %s\n",
		floodBurst*floodNamespaces, floatSpread(burst, "%.2f"), floodBurstGoal, gatewayGoal(burst, func(v float64) bool { return v <= floodBurstGoal }))
}

// floodPct is the p-th percentile of the latencies, 0 when there are none.
func floodPct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return percentile(d, p)
}
