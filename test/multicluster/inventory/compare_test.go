package inventory

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
)

const providerName = "open-cluster-management"

func testAccess() *access.Config {
	return access.New([]access.Provider{{Name: providerName, ExecConfig: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/hubsync",
		Args: []string{"creds", "--managed-serviceaccount=proof"}, ProvideClusterInfo: true,
	}}})
}

// testProfile is a profile as hubsync writes it with a direct provider.
func testProfile() *cpv1alpha1.ClusterProfile {
	p := &cpv1alpha1.ClusterProfile{}
	p.Namespace, p.Name, p.ResourceVersion = "team", "east", "10"
	p.Labels = map[string]string{"x-k8s.io/cluster-manager": providerName}
	p.Status.AccessProviders = []cpv1alpha1.AccessProvider{{Name: providerName, Cluster: clientcmdv1.Cluster{
		Server: "https://127.0.0.41:6443", CertificateAuthorityData: []byte("CA-1"),
		Extensions: []clientcmdv1.NamedExtension{{Name: "client.authentication.k8s.io/exec", Extension: runtime.RawExtension{Raw: []byte(`{"clusterName":"east"}`)}}},
	}}}
	return p
}

func build(t *testing.T, mutate func(*cpv1alpha1.ClusterProfile)) *rest.Config {
	t.Helper()
	p := testProfile()
	mutate(p)
	cfg, err := testAccess().BuildConfigFromCP(p)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestComparisons shows upstream's rule rebuilding on every event while
// the one that sets funcs aside only rebuilds when the config changes.
func TestComparisons(t *testing.T) {
	same := func(*cpv1alpha1.ClusterProfile) {}
	cases := []struct {
		name                            string
		mutate                          func(*cpv1alpha1.ClusterProfile)
		upstream, ignoringFuncs, access bool // whether each says "different"
	}{
		{"same profile built twice", same, true, false, false},
		{"label changed", func(p *cpv1alpha1.ClusterProfile) { p.Labels["env"] = "prod" }, true, false, false},
		{"CA rotated", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.CertificateAuthorityData = []byte("CA-1CA-2")
		}, true, true, true},
		{"server moved", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.Server = "https://localhost:6443"
		}, true, true, true},
		{"proxy-url set", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.ProxyURL = "http://proxy:3128"
		}, true, true, false},
		{"exec extension names another cluster", func(p *cpv1alpha1.ClusterProfile) {
			p.Status.AccessProviders[0].Cluster.Extensions[0].Extension.Raw = []byte(`{"clusterName":"west"}`)
		}, true, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := build(t, same), build(t, tc.mutate)
			if got := !UpstreamSameConfig(a, b); got != tc.upstream {
				t.Errorf("upstream finds them different: %v, want %v", got, tc.upstream)
			}
			if got := !SameConfigIgnoringFuncs(a, b); got != tc.ignoringFuncs {
				t.Errorf("ignoring funcs, different: %v, want %v", got, tc.ignoringFuncs)
			}
			if got := AccessChanged(a, b); got != tc.access {
				t.Errorf("access changed: %v, want %v", got, tc.access)
			}
		})
	}
}

// TestComparisonsWithoutFuncs: configs without any func compare equal
// under both rules, which is what makes upstream's rule work for
// providers that do not set Proxy.
func TestComparisonsWithoutFuncs(t *testing.T) {
	a := &rest.Config{Host: "https://h", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}}
	b := rest.CopyConfig(a)
	if !UpstreamSameConfig(a, b) || !SameConfigIgnoringFuncs(a, b) || AccessChanged(a, b) {
		t.Error("identical configs without funcs must compare equal")
	}
}
