package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
)

// TestAccessProviders: a cluster-proxy style provider with its CA in a
// Secret, a file-based one and the direct provider; rotating the CA Secret
// updates every profile within seconds; entries of other writers stay.
func TestAccessProviders(t *testing.T) {
	proxyNS := fmt.Sprintf("proxy-%d", testSeq.Load()+1)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte("FILE-CA-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, withOptions(func(o *syncer.Options) {
		o.AccessProviders = []config.AccessProvider{
			{
				Name: "open-cluster-management", Type: config.ProviderServer,
				Server:   "https://cluster-proxy-addon-user." + proxyNS + ":9092/{{.ClusterName}}",
				CASecret: &config.SecretKeyRef{Namespace: proxyNS, Name: "cluster-proxy-user-serving-cert", Key: "tls.crt"},
			},
			{Name: "gateway", Type: config.ProviderServer, Server: "https://gateway.example/{{.ClusterName}}", CAFile: caFile},
			{Name: "direct", Type: config.ProviderDirect},
		}
	}))
	h.must(h.hub.Namespace(h.ctx, proxyNS))
	ns := h.namespaces("a", "b")
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	var clusters []string
	for i := range 6 {
		c := h.name(fmt.Sprintf("c%d", i))
		clusters = append(clusters, c)
		h.cluster(c, set, nil)
	}
	// One cluster registers a client config for the direct provider.
	h.must(h.hub.UpdateCluster(h.ctx, clusters[0], func(c *clusterv1.ManagedCluster) {
		c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://" + clusters[0] + ".example:6443", CABundle: []byte("DIRECT-CA")}}
	}))
	for _, n := range ns {
		h.must(h.hub.Bind(h.ctx, n, set, true))
	}
	h.expectProfiles(ns[0], clusters...)

	// Before the CA Secret exists, the proxy entry is left out.
	h.waitIdle()
	p := h.profile(ns[0], clusters[1])
	if e := entry(p, "open-cluster-management"); e != nil {
		t.Fatalf("proxy entry written without a CA: %+v", e)
	}
	if e := entry(p, "gateway"); e == nil || string(e.Cluster.CertificateAuthorityData) != "FILE-CA-1" || e.Cluster.Server != "https://gateway.example/"+clusters[1] {
		t.Fatalf("gateway entry %+v", e)
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-proxy-user-serving-cert", Namespace: proxyNS},
		Data:       map[string][]byte{"tls.crt": []byte("PROXY-CA-1"), "tls.key": []byte("not-for-hubsync")},
	}
	_, err := h.hub.Kube.CoreV1().Secrets(proxyNS).Create(h.ctx, secret, metav1.CreateOptions{})
	h.must(err)
	h.expectProviders(ns, clusters, proxyNS, "PROXY-CA-1", "FILE-CA-1")

	// Someone else adds their own provider to one profile: it stays.
	p = h.profile(ns[1], clusters[2])
	p.Status.AccessProviders = append(p.Status.AccessProviders, cpv1alpha1.AccessProvider{Name: "argocd"})
	_, err = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[1]).UpdateStatus(h.ctx, p, metav1.UpdateOptions{})
	h.must(err)

	// Rotate both CAs.
	secret.Data["tls.crt"] = []byte("PROXY-CA-2")
	_, err = h.hub.Kube.CoreV1().Secrets(proxyNS).Update(h.ctx, secret, metav1.UpdateOptions{})
	h.must(err)
	h.must(os.WriteFile(caFile, []byte("FILE-CA-2"), 0o600))
	h.expectProviders(ns, clusters, proxyNS, "PROXY-CA-2", "FILE-CA-2")
	if entry(h.profile(ns[1], clusters[2]), "argocd") == nil {
		t.Fatalf("another writer's access provider was removed")
	}

	// The direct provider only where the cluster has a client config.
	for _, n := range ns {
		d := entry(h.profile(n, clusters[0]), "direct")
		if d == nil || d.Cluster.Server != "https://"+clusters[0]+".example:6443" || string(d.Cluster.CertificateAuthorityData) != "DIRECT-CA" {
			t.Fatalf("direct entry in %s: %+v", n, d)
		}
		if entry(h.profile(n, clusters[1]), "direct") != nil {
			t.Fatalf("direct entry for a cluster without a client config")
		}
	}

	// The CA Secret deleted: profiles keep the last CA.
	h.must(h.hub.Kube.CoreV1().Secrets(proxyNS).Delete(h.ctx, secret.Name, metav1.DeleteOptions{}))
	h.waitIdle()
	h.expectProviders(ns, clusters, proxyNS, "PROXY-CA-2", "FILE-CA-2")
}

func (h *harness) profile(ns, name string) *cpv1alpha1.ClusterProfile {
	h.t.Helper()
	p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Get(h.ctx, name, metav1.GetOptions{})
	h.must(err)
	return p
}

func entry(p *cpv1alpha1.ClusterProfile, name string) *cpv1alpha1.AccessProvider {
	for i := range p.Status.AccessProviders {
		if p.Status.AccessProviders[i].Name == name {
			return &p.Status.AccessProviders[i]
		}
	}
	return nil
}

// expectProviders waits until every profile carries the proxy and gateway
// entries with the given CAs, the proxy server for its cluster and the exec
// extension with the cluster's name.
func (h *harness) expectProviders(namespaces, clusters []string, proxyNS, proxyCA, fileCA string) {
	h.t.Helper()
	h.eventually("access providers with "+proxyCA+" and "+fileCA, func() error {
		for _, n := range namespaces {
			for _, c := range clusters {
				p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(n).Get(h.ctx, c, metav1.GetOptions{})
				if err != nil {
					return err
				}
				e := entry(p, "open-cluster-management")
				if e == nil || string(e.Cluster.CertificateAuthorityData) != proxyCA {
					return fmt.Errorf("%s/%s proxy entry %+v", n, c, e)
				}
				if want := fmt.Sprintf("https://cluster-proxy-addon-user.%s:9092/%s", proxyNS, c); e.Cluster.Server != want {
					return fmt.Errorf("%s/%s proxy server %q", n, c, e.Cluster.Server)
				}
				if len(e.Cluster.Extensions) != 1 || e.Cluster.Extensions[0].Name != hub.ExecExtensionKey ||
					!bytes.Contains(e.Cluster.Extensions[0].Extension.Raw, []byte(`"clusterName":"`+c+`"`)) {
					return fmt.Errorf("%s/%s exec extension %+v", n, c, e.Cluster.Extensions)
				}
				if g := entry(p, "gateway"); g == nil || string(g.Cluster.CertificateAuthorityData) != fileCA {
					return fmt.Errorf("%s/%s gateway entry %+v", n, c, g)
				}
			}
		}
		return nil
	})
}
