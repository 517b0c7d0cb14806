package access

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/client-go/rest"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// DefaultProvider is the access provider a Source uses unless told
// otherwise: the name OCM's cluster-proxy and hubsync write.
const DefaultProvider = "open-cluster-management"

// providerConfig is the rest.Config of a profile's access provider named
// provider: its server, CA, TLS server name and proxy, with no credential.
// An entry in status.accessProviders wins over a deprecated
// status.credentialProviders entry of the same name, as in
// cluster-inventory-api's pkg/access.
func providerConfig(p *cpv1alpha1.ClusterProfile, provider string) (*rest.Config, error) {
	var found *cpv1alpha1.AccessProvider
	for _, list := range [][]cpv1alpha1.AccessProvider{p.Status.CredentialProviders, p.Status.AccessProviders} {
		for i := range list {
			if list[i].Name == provider {
				found = &list[i]
			}
		}
	}
	if found == nil {
		return nil, fmt.Errorf("cluster profile %s/%s has no access provider %q", p.Namespace, p.Name, provider)
	}
	c := found.Cluster
	if strings.TrimSpace(c.Server) == "" {
		return nil, fmt.Errorf("cluster profile %s/%s: access provider %q has no server", p.Namespace, p.Name, provider)
	}
	cfg := &rest.Config{
		Host: c.Server,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure:   c.InsecureSkipTLSVerify,
			ServerName: c.TLSServerName,
			CAData:     append([]byte(nil), c.CertificateAuthorityData...),
		},
		DisableCompression: c.DisableCompression,
	}
	if len(cfg.CAData) == 0 {
		cfg.CAFile = c.CertificateAuthority
	}
	// A Proxy func is set only when the provider names a proxy: any Proxy
	// func keeps client-go from sharing one transport between configs.
	if c.ProxyURL != "" {
		u, err := url.Parse(c.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("cluster profile %s/%s: access provider %q: proxy-url: %w", p.Namespace, p.Name, provider, err)
		}
		cfg.Proxy = http.ProxyURL(u)
	}
	return cfg, nil
}
