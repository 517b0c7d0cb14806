package tunnel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/test/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clusterfake "open-cluster-management.io/api/client/cluster/clientset/versioned/fake"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpfake "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned/fake"
)

func TestTargetFromTheHub(t *testing.T) {
	mc := func(url string, ca string) *clusterv1.ManagedCluster {
		c := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}
		if url != "" {
			c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: url, CABundle: []byte(ca)}}
		}
		return c
	}
	secret := &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte(" tok \n"), hub.CAKey: []byte("msa-ca")}}
	tests := []struct {
		name       string
		opts       SourceOptions
		cluster    *clusterv1.ManagedCluster
		secret     *corev1.Secret
		want       Target
		wantErr    string
		tokenFound bool
	}{
		{name: "konnectivity defaults: cluster-proxy's address, in-cluster name, the MSA's CA",
			opts: SourceOptions{Transport: TransportKonnectivity}, cluster: mc("https://api.edge-1.example:6443", "mc-ca"), secret: secret,
			want: Target{Address: "edge-1:443", ServerName: "kubernetes.default.svc", CA: []byte("msa-ca"), Token: "tok"}, tokenFound: true},
		{name: "konnectivity without an MSA Secret falls back to the cluster's CA bundle",
			opts: SourceOptions{Transport: TransportKonnectivity}, cluster: mc("https://api.edge-1.example:6443", "mc-ca"),
			want: Target{Address: "edge-1:443", ServerName: "kubernetes.default.svc", CA: []byte("mc-ca")}},
		{name: "dial address from the cluster's URL, default port",
			opts: SourceOptions{Transport: TransportKonnectivity, DialAddress: "{{.ServerHost}}"}, cluster: mc("https://10.0.0.7", ""),
			want: Target{Address: "10.0.0.7:443", ServerName: "kubernetes.default.svc"}},
		{name: "dial address from the URL but the cluster has none",
			opts: SourceOptions{Transport: TransportKonnectivity, DialAddress: "{{.ServerHost}}"}, cluster: mc("", ""),
			wantErr: "not host:port"},
		{name: "direct: the URL, its host as the name, the cluster's CA bundle first",
			opts: SourceOptions{Transport: TransportDirect}, cluster: mc("https://api.edge-1.example:6443", "mc-ca"), secret: secret,
			want: Target{Address: "api.edge-1.example:6443", ServerName: "api.edge-1.example", CA: []byte("mc-ca"), Token: "tok"}, tokenFound: true},
		{name: "direct without a URL",
			opts: SourceOptions{Transport: TransportDirect}, cluster: mc("", ""), wantErr: "no spec.managedClusterClientConfigs URL"},
		{name: "server name override",
			opts: SourceOptions{Transport: TransportDirect, ServerName: "api.internal"}, cluster: mc("https://1.2.3.4:6443", "ca"),
			want: Target{Address: "1.2.3.4:6443", ServerName: "api.internal", CA: []byte("ca")}},
		{name: "a URL that is not one",
			opts: SourceOptions{Transport: TransportDirect}, cluster: mc("://nope", ""), wantErr: "is not a URL"},
		{name: "the cluster's set from its label",
			opts: SourceOptions{Transport: TransportDirect}, cluster: inSet(mc("https://1.2.3.4:6443", "ca"), "prod"),
			want: Target{Address: "1.2.3.4:6443", ServerName: "1.2.3.4", CA: []byte("ca"), ClusterSet: "prod"}},
		{name: "the set also when the cluster cannot be dialed",
			opts: SourceOptions{Transport: TransportDirect}, cluster: inSet(mc("", ""), "edge"),
			want: Target{ClusterSet: "edge"}, wantErr: "no spec.managedClusterClientConfigs URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.DialAddress == "" {
				tt.opts.DialAddress = config.DefaultTunnelDialAddress
			}
			tmpl, err := ParseDialAddress(tt.opts.DialAddress)
			if err != nil {
				t.Fatal(err)
			}
			s := &Source{opts: tt.opts, tmpl: tmpl}
			got := s.target(tt.cluster, tt.secret)
			if got.ClusterSet != tt.want.ClusterSet {
				t.Fatalf("cluster set %q, want %q", got.ClusterSet, tt.want.ClusterSet)
			}
			if tt.wantErr != "" {
				if got.Err == nil || !strings.Contains(got.Err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", got.Err, tt.wantErr)
				}
				return
			}
			if got.Err != nil {
				t.Fatal(got.Err)
			}
			if (got.TokenFingerprint != "") != tt.tokenFound || strings.Contains(got.TokenFingerprint, "tok") {
				t.Fatalf("fingerprint %q", got.TokenFingerprint)
			}
			got.TokenFingerprint = ""
			if got.Address != tt.want.Address || got.ServerName != tt.want.ServerName || string(got.CA) != string(tt.want.CA) || got.Token != tt.want.Token {
				t.Fatalf("target %+v, want %+v", got, tt.want)
			}
		})
	}
}

// newTestSource makes a source on a hub cache of its own over the fake
// clients, running until the test ends.
func newTestSource(t *testing.T, cc *clusterfake.Clientset, kube *kubefake.Clientset, opts SourceOptions, p *Pool) (*Source, error) {
	t.Helper()
	hc, err := hubcache.New(hubcache.Clients{Kube: kube, Cluster: cc, Profiles: cpfake.NewSimpleClientset()}, 0, nil)
	if err != nil {
		return nil, err
	}
	s, err := NewSource(hc, opts, p, testLogger(t))
	if err != nil {
		return nil, err
	}
	hc.Start(context.Background())
	t.Cleanup(hc.Stop)
	return s, nil
}

func inSet(mc *clusterv1.ManagedCluster, set string) *clusterv1.ManagedCluster {
	mc.Labels = map[string]string{hub.LabelClusterSet: set}
	return mc
}

// TestSourceFollowsTheClusterSet: the pool's status of a cluster names
// the set its ManagedCluster's label names, and follows the label as it
// changes and goes, whether the cluster's entry is dialed or waits for
// its first request (on demand).
func TestSourceFollowsTheClusterSet(t *testing.T) {
	for _, onDemand := range []bool{false, true} {
		t.Run(fmt.Sprintf("onDemand=%v", onDemand), func(t *testing.T) {
			mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "edge-1",
				Labels: map[string]string{"pick": "yes", hub.LabelClusterSet: "prod"}},
				Spec: clusterv1.ManagedClusterSpec{ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://127.0.0.1:1"}}}}
			p, _ := newTestPool(t, func(o *Options) {
				o.OnDemand, o.IdleTimeout = onDemand, time.Hour
			})
			cc := clusterfake.NewSimpleClientset(mc)
			s, err := newTestSource(t, cc, kubefake.NewSimpleClientset(),
				SourceOptions{Transport: TransportDirect, DialAddress: "{{.ServerHost}}",
					Selector: labels.SelectorFromSet(labels.Set{"pick": "yes"}), ClusterManager: "cm"}, p)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := s.Run(ctx); err != nil {
				t.Fatal(err)
			}
			for _, set := range []string{"prod", "staging", ""} {
				if set != "prod" {
					mc = mc.DeepCopy()
					if set == "" {
						delete(mc.Labels, hub.LabelClusterSet)
					} else {
						mc.Labels[hub.LabelClusterSet] = set
					}
					if _, err := cc.ClusterV1().ManagedClusters().Update(ctx, mc, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				if err := testutil.Poll(ctx, 10*time.Second, 5*time.Millisecond, func() error {
					st, ok := p.Status("edge-1")
					switch {
					case !ok:
						return errors.New("not served")
					case st.ClusterSet != set:
						return fmt.Errorf("status names set %q (state %s)", st.ClusterSet, st.State)
					}
					return nil
				}); err != nil {
					t.Fatalf("label set to %q: %v", set, err)
				}
			}
		})
	}
}

// TestSourceKeepsEveryClusterWithItsToken starts many Sources whose
// ManagedCluster and token Secret are both on the hub: the two informers
// sync the cluster from goroutines of their own, and every Source must
// end with the cluster in the pool, with its token. Without sync being
// serialised, a read of the listers applied after a later one lost the
// cluster or its token in about 1 of 300 Sources.
func TestSourceKeepsEveryClusterWithItsToken(t *testing.T) {
	const workers, each = 16, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				name := fmt.Sprintf("c%d-%d", w, i)
				mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pick": "yes"}},
					Spec: clusterv1.ManagedClusterSpec{ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://127.0.0.1:1"}}}}
				sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "msa", Namespace: name,
					Labels: map[string]string{hub.LabelIsManagedServiceAccount: "true"}}, Data: map[string][]byte{hub.TokenKey: []byte("tok")}}
				p, _ := newTestPool(t, nil)
				s, err := newTestSource(t, clusterfake.NewSimpleClientset(mc), kubefake.NewSimpleClientset(sec),
					SourceOptions{Transport: TransportDirect, DialAddress: "{{.ServerHost}}", ManagedServiceAccount: "msa",
						Selector: labels.SelectorFromSet(labels.Set{"pick": "yes"}), ClusterManager: "cm"}, p)
				if err != nil {
					t.Error(err)
					return
				}
				ctx, cancel := context.WithCancel(context.Background())
				if err := s.Run(ctx); err != nil {
					t.Error(err)
				}
				served := func() bool {
					auth, err := p.Authorization(name)
					return err == nil && auth == "Bearer tok"
				}
				if err := testutil.Poll(ctx, 5*time.Second, 5*time.Millisecond, func() error {
					if !served() {
						return errors.New("not served with its token")
					}
					return nil
				}); err != nil {
					t.Errorf("cluster %s: %v", name, err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
}

// TestSourceRunReturnsWithEveryCluster: when Run returns, the pool
// already knows every cluster of the first list (the handlers have been
// handed them, not merely the caches), so that a replica's warm-up
// counts them all.
func TestSourceRunReturnsWithEveryCluster(t *testing.T) {
	const n = 500
	var objs, secrets []runtime.Object
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		objs = append(objs, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pick": "yes"}},
			Spec: clusterv1.ManagedClusterSpec{ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://127.0.0.1:1"}}}})
		secrets = append(secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "msa", Namespace: name,
			Labels: map[string]string{hub.LabelIsManagedServiceAccount: "true"}}, Data: map[string][]byte{hub.TokenKey: []byte("tok")}})
	}
	p, _ := newTestPool(t, nil)
	s, err := newTestSource(t, clusterfake.NewSimpleClientset(objs...), kubefake.NewSimpleClientset(secrets...),
		SourceOptions{Transport: TransportDirect, DialAddress: "{{.ServerHost}}", ManagedServiceAccount: "msa",
			Selector: labels.SelectorFromSet(labels.Set{"pick": "yes"}), ClusterManager: "cm"}, p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i := range n {
		if auth, err := p.Authorization(fmt.Sprintf("c%d", i)); err != nil || auth != "Bearer tok" {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d clusters unknown to the pool (or without their token) when Run returned", missing, n)
	}
}

// TestTargetFromTheCachedCluster: the target made from a ManagedCluster
// as the hub cache keeps it is the one made from the whole object, over
// either transport.
func TestTargetFromTheCachedCluster(t *testing.T) {
	mc := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-1", UID: "u1", Labels: map[string]string{hub.LabelClusterSet: "prod"},
			Annotations: map[string]string{"big": strings.Repeat("x", 100)}},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true,
			ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://10.0.0.1:6443", CABundle: []byte("ca")}}},
		Status: clusterv1.ManagedClusterStatus{Version: clusterv1.ManagedClusterVersion{Kubernetes: "v1.35.0"}},
	}
	sec := &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte("tok"), hub.CAKey: []byte("msa-ca")}}
	obj, err := hubcache.TrimCluster(mc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	for _, transport := range []string{TransportKonnectivity, TransportDirect} {
		s := &Source{opts: SourceOptions{Transport: transport, DialAddress: "{{.ServerHost}}"}}
		s.tmpl, _ = ParseDialAddress(s.opts.DialAddress)
		if whole, cached := s.target(mc, sec), s.target(obj.(*clusterv1.ManagedCluster), sec); fmt.Sprintf("%+v", whole) != fmt.Sprintf("%+v", cached) {
			t.Errorf("%s: target %+v from the cached cluster, %+v from the whole", transport, cached, whole)
		}
	}
}

// TestTokenHeldOnce: the target's token is the tail of the Authorization
// header value the pool and the probes send, so an entry holds its token
// once however often it is used.
func TestTokenHeldOnce(t *testing.T) {
	mc := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-1", UID: "u1"},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true,
			ManagedClusterClientConfigs: []clusterv1.ClientConfig{{URL: "https://10.0.0.1:6443", CABundle: []byte("ca")}}},
	}
	sec := &corev1.Secret{Data: map[string][]byte{hub.TokenKey: []byte(" tok\n")}}
	s := &Source{opts: SourceOptions{Transport: TransportDirect, DialAddress: "{{.ServerHost}}"}}
	s.tmpl, _ = ParseDialAddress(s.opts.DialAddress)
	tg := s.target(mc, sec)
	if tg.Token != "tok" || tg.TokenFingerprint != hub.TokenFingerprint([]byte("tok")) {
		t.Fatalf("token %q, fingerprint %q; want tok and its fingerprint", tg.Token, tg.TokenFingerprint)
	}
	p, _ := newTestPool(t, nil)
	p.SetTarget("edge-1", &tg)
	p.mu.Lock()
	auth := p.targets["edge-1"].bearer
	p.mu.Unlock()
	if auth != "Bearer tok" || unsafe.StringData(auth[len("Bearer "):]) != unsafe.StringData(tg.Token) {
		t.Fatalf("Authorization %q is a copy of the token; want the string the token is the tail of", auth)
	}
	// A target made elsewhere, or whose token was replaced, still gets
	// its own token's header.
	other := tg
	other.Token = "new"
	p.SetTarget("edge-1", &other)
	p.mu.Lock()
	got := p.targets["edge-1"].bearer
	p.mu.Unlock()
	if got != "Bearer new" {
		t.Fatalf("the Authorization value %q after the token changed; want Bearer new", got)
	}
}
