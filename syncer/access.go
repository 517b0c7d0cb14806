package syncer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"text/template"

	"github.com/hubsync/hubsync/hub"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// Provider is one access provider, resolved for writing: its server
// template parsed and its current CA bundle loaded.
type Provider struct {
	Name string
	// Direct providers use the ManagedCluster's own client config.
	Direct bool
	// Server renders the URL from {{.ClusterName}} (server providers).
	Server *template.Template
	// CA is the server's CA bundle (server providers); nil while unknown.
	CA []byte
	// ClusterNameExtension adds the exec extension with the cluster name.
	ClusterNameExtension bool
}

// ParseServerTemplate parses a server URL template.
func ParseServerTemplate(s string) (*template.Template, error) {
	t, err := template.New("server").Option("missingkey=error").Parse(s)
	if err != nil {
		return nil, fmt.Errorf("server template %q: %w", s, err)
	}
	return t, nil
}

// AccessProviderFor returns the status.accessProviders entry of p for
// cluster, or nil when the provider cannot describe the cluster yet (a
// server provider whose CA is unknown, a direct provider for a cluster
// without a client config).
func AccessProviderFor(p Provider, cluster *clusterv1.ManagedCluster) *cpv1alpha1.AccessProvider {
	var c clientcmdv1.Cluster
	if p.Direct {
		cfg := firstClientConfig(cluster)
		if cfg == nil {
			return nil
		}
		c.Server = cfg.URL
		c.CertificateAuthorityData = cfg.CABundle
	} else {
		if len(p.CA) == 0 || p.Server == nil {
			return nil
		}
		var b strings.Builder
		if err := p.Server.Execute(&b, struct{ ClusterName string }{cluster.Name}); err != nil {
			return nil
		}
		c.Server = b.String()
		c.CertificateAuthorityData = p.CA
	}
	if p.ClusterNameExtension {
		c.Extensions = []clientcmdv1.NamedExtension{{Name: hub.ExecExtensionKey, Extension: runtime.RawExtension{Raw: hub.ExecClusterConfigJSON(cluster.Name)}}}
	}
	return &cpv1alpha1.AccessProvider{Name: p.Name, Cluster: c}
}

func firstClientConfig(cluster *clusterv1.ManagedCluster) *clusterv1.ClientConfig {
	for i := range cluster.Spec.ManagedClusterClientConfigs {
		if cluster.Spec.ManagedClusterClientConfigs[i].URL != "" {
			return &cluster.Spec.ManagedClusterClientConfigs[i]
		}
	}
	return nil
}

// mergeAccessProviders sets hubsync's providers in list, keeping entries of
// other names (and their order) and removing an entry of ours that cannot
// be written now. An existing entry that already says the same thing is
// kept as it is, so that JSON re-encoding by the server never causes a
// write.
func mergeAccessProviders(list []cpv1alpha1.AccessProvider, providers []Provider, cluster *clusterv1.ManagedCluster) []cpv1alpha1.AccessProvider {
	if len(providers) == 0 {
		return list
	}
	want := make(map[string]*cpv1alpha1.AccessProvider, len(providers))
	for _, p := range providers {
		want[p.Name] = AccessProviderFor(p, cluster)
	}
	out := make([]cpv1alpha1.AccessProvider, 0, len(list)+len(providers))
	seen := map[string]bool{}
	for _, e := range list {
		w, ours := want[e.Name]
		switch {
		case !ours:
			out = append(out, e)
		case w == nil || seen[e.Name]:
			// Ours but not writable now, or a duplicate: drop it.
		case sameProvider(e, *w):
			out = append(out, e)
		default:
			out = append(out, *w)
		}
		seen[e.Name] = true
	}
	for _, p := range providers {
		if w := want[p.Name]; w != nil && !seen[p.Name] {
			out = append(out, *w)
		}
	}
	return out
}

// sameProvider compares two entries, extensions by their JSON meaning.
func sameProvider(a, b cpv1alpha1.AccessProvider) bool {
	if a.Name != b.Name || len(a.Cluster.Extensions) != len(b.Cluster.Extensions) {
		return false
	}
	for i := range a.Cluster.Extensions {
		ea, eb := a.Cluster.Extensions[i], b.Cluster.Extensions[i]
		if ea.Name != eb.Name || !sameJSON(ea.Extension.Raw, eb.Extension.Raw) {
			return false
		}
	}
	ac, bc := a.Cluster, b.Cluster
	ac.Extensions, bc.Extensions = nil, nil
	return ac.Server == bc.Server && bytes.Equal(ac.CertificateAuthorityData, bc.CertificateAuthorityData) &&
		reflect.DeepEqual(normalize(ac), normalize(bc))
}

func normalize(c clientcmdv1.Cluster) clientcmdv1.Cluster {
	c.CertificateAuthorityData = nil
	return c
}

func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
