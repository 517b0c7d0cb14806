package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// The hold-offs of TestForeignWriters, short so that a hold-off begins,
// doubles, ends and clears within seconds, and the pace of its foreign
// writers.
const (
	foreignHoldOff    = 2 * time.Second
	foreignMaxHoldOff = 4 * time.Second
	foreignPace       = 200 * time.Millisecond
)

// TestForeignWriters runs the hubsync binary beside two of the controllers
// it replaces, left on by mistake: "cluster-proxy" rewrites one profile's
// open-cluster-management access provider with its own server, and
// "managed-serviceaccount" rewrites one credential copy's CA, each every
// 200 ms. hubsync reports each object once it is contested (a
// ForeignWriter Event on the profile naming the writer and the feature gate
// to turn off, hubsync_contested_objects, a /readyz?verbose line, ready all
// along), writes each about once per hold-off rather than after every
// foreign write, and keeps serving the other cluster; once the writers
// stop, both objects are hubsync's again within the hold-off and the
// contested state clears.
func TestForeignWriters(t *testing.T) {
	f := newForeignFixture(t)
	f.expectConverged()

	proxy := f.startWriter("cluster-proxy", f.rewriteProvider)
	msa := f.startWriter("managed-serviceaccount", f.rewriteCopy)
	f.expectEvent("ClusterProfile "+f.ns+"/"+f.c1, "cluster-proxy", "ClusterProfileAccessProvider")
	f.expectEvent("credential copy "+f.ns+"/"+f.copyName, "managed-serviceaccount", "ClusterProfileCredSyncer")
	f.expectContested(1, 1)
	f.expectReadyz("[+]contested ok: 2 objects written by another controller (cluster-proxy: 1 profile, managed-serviceaccount: 1 credential copy)")
	f.expectHeldBack(proxy, msa)
	f.expectOtherClusterServed()

	proxy.stop()
	msa.stop()
	stopped := time.Now()
	f.expectConverged()
	took := time.Since(stopped)
	t.Logf("the objects were hubsync's again %s after the writers stopped", took.Round(time.Millisecond))
	if took > foreignMaxHoldOff+2*time.Second {
		t.Errorf("the objects were hubsync's again %s after the writers stopped; want within the hold-off (at most %s)", took, foreignMaxHoldOff)
	}
	f.expectContested(0, 0)
	t.Logf("no object contested %s after the writers stopped", time.Since(stopped).Round(time.Millisecond))
	f.expectReadyz("[+]contested ok: no object is written by another controller")
	if n := f.metric("hubsync_foreign_writes_total", testutil.Labels{"kind": "profile"}); n < 2 {
		t.Errorf("hubsync_foreign_writes_total{kind=profile} = %v, want at least 2", n)
	}
	f.expectNoTokenLeak()
}

// foreignFixture is a daemon writing two clusters' profiles, one with a
// credential copy, in one consumer namespace.
type foreignFixture struct {
	h                  *harness
	d                  *fleet.Daemon
	logs               *fleet.LogBuffer
	ns, proxyNS        string
	c1, c2, copyName   string
	hubCA, upstreamURL string
}

func newForeignFixture(t *testing.T) *foreignFixture {
	h := newHarnessWithoutSyncer(t)
	f := &foreignFixture{h: h, logs: &fleet.LogBuffer{}, proxyNS: h.name("proxy"), c1: h.name("c1"), c2: h.name("c2")}
	f.copyName = f.c1 + "-app"
	f.upstreamURL = "https://cluster-proxy-addon-user.open-cluster-management-addon:9092/" + f.c1
	h.must(h.hub.Namespace(h.ctx, f.proxyNS))
	h.must(h.hub.PutSecret(h.ctx, f.proxyNS, "cluster-proxy-user-serving-cert", map[string][]byte{"tls.crt": []byte("PROXY-CA")}))
	f.ns = h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.must(h.hub.Bind(h.ctx, f.ns, set, true))
	h.cluster(f.c1, set, nil)
	h.cluster(f.c2, set, nil)
	_, err := h.hub.CreateMSA(h.ctx, f.c1, "app", true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.c1, "app", fleet.FakeJWT(time.Now().Add(time.Hour)), nil))
	hubSecret, err := h.hub.Kube.CoreV1().Secrets(f.c1).Get(h.ctx, "app", metav1.GetOptions{})
	h.must(err)
	f.hubCA = string(hubSecret.Data["ca.crt"])

	off := false
	conf := config.Config{
		Bus: config.Bus{Enabled: &off},
		AccessProviders: []config.AccessProvider{{
			Name: "open-cluster-management", Type: config.ProviderServer,
			Server:   "https://cluster-proxy-addon-user." + f.proxyNS + ":9092/{{.ClusterName}}",
			CASecret: &config.SecretKeyRef{Namespace: f.proxyNS, Name: "cluster-proxy-user-serving-cert", Key: "tls.crt"},
		}},
		ForeignWriters: config.ForeignWriters{HoldOff: metav1.Duration{Duration: foreignHoldOff}, MaxHoldOff: metav1.Duration{Duration: foreignMaxHoldOff}},
	}
	f.d, err = fleet.StartDaemon(h.ctx, testutil.Hubsync(t), hubConfig, conf, f.logs)
	h.must(err)
	t.Cleanup(func() {
		_ = f.d.Stop()
		if t.Failed() {
			t.Logf("hubsync's logs:\n%s", f.logs.String())
		}
	})
	h.must(f.d.WaitReady(h.ctx, 60*time.Second))
	return f
}

// hubsyncServer is the server hubsync writes for c1.
func (f *foreignFixture) hubsyncServer() string {
	return "https://cluster-proxy-addon-user." + f.proxyNS + ":9092/" + f.c1
}

// expectConverged waits until c1's access provider and copy say what
// hubsync writes.
func (f *foreignFixture) expectConverged() {
	f.h.t.Helper()
	f.h.eventually("c1's access provider and copy as hubsync writes them", func() error {
		p, err := f.h.hub.Profiles.ApisV1alpha1().ClusterProfiles(f.ns).Get(f.h.ctx, f.c1, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if e := entry(p, "open-cluster-management"); e == nil || e.Cluster.Server != f.hubsyncServer() || string(e.Cluster.CertificateAuthorityData) != "PROXY-CA" {
			return fmt.Errorf("access provider %+v", e)
		}
		sec, err := f.h.hub.Kube.CoreV1().Secrets(f.ns).Get(f.h.ctx, f.copyName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(sec.Data["ca.crt"]) != f.hubCA {
			return errors.New("the copy's CA is not the hub Secret's")
		}
		return nil
	})
}

// foreignWriter is a controller that writes what hubsync writes, at
// foreignPace, as its own field manager.
type foreignWriter struct {
	manager string
	// tries counts its passes; writes those that changed the object.
	tries, writes atomic.Int64
	cancel        context.CancelFunc
	wg            sync.WaitGroup
	once          sync.Once
}

// startWriter runs write every foreignPace until stopped (at the latest
// when the test ends). write reports whether it changed the object.
func (f *foreignFixture) startWriter(manager string, write func(ctx context.Context, manager string) (bool, error)) *foreignWriter {
	ctx, cancel := context.WithCancel(f.h.ctx)
	w := &foreignWriter{manager: manager, cancel: cancel}
	w.wg.Go(func() {
		tick := time.NewTicker(foreignPace)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.tries.Add(1)
			// A conflict (hubsync wrote in between) is tried again at the
			// next pass, as a controller's requeue would.
			if changed, err := write(ctx, manager); err == nil && changed {
				w.writes.Add(1)
			}
		}
	})
	f.h.t.Cleanup(w.stop)
	return w
}

func (w *foreignWriter) stop() {
	w.once.Do(func() {
		w.cancel()
		w.wg.Wait()
	})
}

// rewriteProvider writes cluster-proxy's own server into c1's
// open-cluster-management access provider, as its controller does.
func (f *foreignFixture) rewriteProvider(ctx context.Context, manager string) (bool, error) {
	profiles := f.h.hub.Profiles.ApisV1alpha1().ClusterProfiles(f.ns)
	p, err := profiles.Get(ctx, f.c1, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	ext, _ := json.Marshal(map[string]string{"clusterName": f.c1})
	want := cpv1alpha1.AccessProvider{Name: "open-cluster-management", Cluster: clientcmdv1.Cluster{
		Server: f.upstreamURL, CertificateAuthorityData: []byte("UPSTREAM-CA"),
		Extensions: []clientcmdv1.NamedExtension{{Name: "client.authentication.k8s.io/exec", Extension: runtime.RawExtension{Raw: ext}}},
	}}
	e := entry(p, want.Name)
	switch {
	case e == nil:
		p.Status.AccessProviders = append(p.Status.AccessProviders, want)
	case e.Cluster.Server == want.Cluster.Server:
		return false, nil
	default:
		*e = want
	}
	_, err = profiles.UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: manager})
	return err == nil, err
}

// rewriteCopy writes another CA into c1's credential copy.
func (f *foreignFixture) rewriteCopy(ctx context.Context, manager string) (bool, error) {
	secrets := f.h.hub.Kube.CoreV1().Secrets(f.ns)
	sec, err := secrets.Get(ctx, f.copyName, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	if string(sec.Data["ca.crt"]) == "UPSTREAM-CA" {
		return false, nil
	}
	sec.Data["ca.crt"] = []byte("UPSTREAM-CA")
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{FieldManager: manager})
	return err == nil, err
}

// expectEvent waits for a ForeignWriter Event on c1's profile about what
// (a kind and an object), naming the writer's field manager and the gate
// to turn off.
func (f *foreignFixture) expectEvent(what, writer, gate string) {
	f.h.t.Helper()
	f.h.eventually("ForeignWriter Event about "+what, func() error {
		evs, err := f.h.hub.Kube.CoreV1().Events(f.ns).List(f.h.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason != "ForeignWriter" || e.InvolvedObject.Kind != "ClusterProfile" || e.InvolvedObject.Name != f.c1 {
				continue
			}
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, what+" ") &&
				strings.Contains(e.Message, fmt.Sprintf("field manager %q", writer)) && strings.Contains(e.Message, gate) {
				f.h.t.Logf("Event: %s", e.Message)
				return nil
			}
			seen = append(seen, e.Message)
		}
		return fmt.Errorf("none yet; other ForeignWriter Events: %q", seen)
	})
}

func (f *foreignFixture) metric(name string, labels testutil.Labels) float64 {
	f.h.t.Helper()
	m, err := f.d.Scrape()
	f.h.must(err)
	return m.Value(name, labels)
}

// expectContested waits until hubsync_contested_objects counts the given
// profiles and copies.
func (f *foreignFixture) expectContested(profiles, copies float64) {
	f.h.t.Helper()
	testutil.Eventually(f.h.t, 3*foreignMaxHoldOff+20*time.Second, 50*time.Millisecond, func() error {
		m, err := f.d.Scrape()
		if err != nil {
			return err
		}
		p := m.Value("hubsync_contested_objects", testutil.Labels{"kind": "profile"})
		c := m.Value("hubsync_contested_objects", testutil.Labels{"kind": "credential"})
		if p != profiles || c != copies {
			return fmt.Errorf("%v profiles, %v copies", p, c)
		}
		return nil
	}, "hubsync_contested_objects = %v profiles, %v copies", profiles, copies)
}

// expectReadyz waits until /readyz?verbose answers 200 with line.
func (f *foreignFixture) expectReadyz(line string) {
	f.h.t.Helper()
	f.h.eventually("/readyz?verbose with "+line, func() error {
		resp, err := http.Get("http://" + f.d.Address + "/readyz?verbose")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), line+"\n") {
			return fmt.Errorf("%s:\n%s", resp.Status, body)
		}
		return nil
	})
}

// expectHeldBack lets each writer try 25 more times (5 s, two or three
// hold-offs) and checks that hubsync wrote each contested object about
// once per hold-off meanwhile, where fighting the writer would cost a write
// after each of its writes.
func (f *foreignFixture) expectHeldBack(writers ...*foreignWriter) {
	h := f.h
	h.t.Helper()
	status := testutil.Labels{"op": "status"}
	copies := testutil.Labels{"op": "update"}
	start := time.Now()
	s0, c0 := f.metric("hubsync_profile_writes_total", status), f.metric("hubsync_credential_writes_total", copies)
	tries := make([]int64, len(writers))
	writes := make([]int64, len(writers))
	for i, w := range writers {
		tries[i], writes[i] = w.tries.Load(), w.writes.Load()
	}
	testutil.Eventually(h.t, 30*time.Second, 50*time.Millisecond, func() error {
		for i, w := range writers {
			if n := w.tries.Load() - tries[i]; n < 25 {
				return fmt.Errorf("%s tried %d times", w.manager, n)
			}
		}
		return nil
	}, "25 passes of each writer")
	elapsed := time.Since(start)
	s, c := f.metric("hubsync_profile_writes_total", status)-s0, f.metric("hubsync_credential_writes_total", copies)-c0
	bound := float64(elapsed/foreignHoldOff) + 1
	for i, w := range writers {
		h.t.Logf("in %s %s wrote %d times", elapsed.Round(time.Millisecond), w.manager, w.writes.Load()-writes[i])
	}
	h.t.Logf("in %s hubsync wrote the contested profile's status %v times and the copy %v times (at most %v: one per hold-off)",
		elapsed.Round(time.Millisecond), s, c, bound)
	if s > bound || c > bound {
		h.t.Errorf("hubsync wrote the contested profile %v times and the copy %v times in %s; want at most %v each (one per hold-off of %s or more)",
			s, c, elapsed.Round(time.Millisecond), bound, foreignHoldOff)
	}
}

// expectOtherClusterServed changes c2's claims and waits for its profile to
// follow.
func (f *foreignFixture) expectOtherClusterServed() {
	h := f.h
	h.t.Helper()
	h.must(h.hub.UpdateClusterStatus(h.ctx, f.c2, func(st *clusterv1.ManagedClusterStatus) {
		st.ClusterClaims = append(st.ClusterClaims, clusterv1.ManagedClusterClaim{Name: "zone.example", Value: "z1"})
	}))
	took := testutil.Eventually(h.t, 10*time.Second, 25*time.Millisecond, func() error { return h.checkProfile(f.ns, f.c2) },
		"the other cluster's profile follows its claims")
	h.t.Logf("the other cluster's profile followed its claims in %s", took.Round(time.Millisecond))
}

// expectNoTokenLeak checks hubsync's log, the Events and /metrics for the
// tokens the test wrote.
func (f *foreignFixture) expectNoTokenLeak() {
	h := f.h
	h.t.Helper()
	texts := map[string]string{"hubsync's log": f.logs.String()}
	m, err := f.d.Metrics()
	h.must(err)
	texts["/metrics"] = m
	evs, err := h.hub.Kube.CoreV1().Events(f.ns).List(h.ctx, metav1.ListOptions{})
	h.must(err)
	for _, e := range evs.Items {
		texts["Event "+e.Name] = e.Message
	}
	for what, text := range texts {
		for _, l := range leak.Tokens(text, h.hub.Tokens()) {
			h.t.Errorf("%s appears in %s", l, what)
		}
	}
}
