package syncer

import (
	"reflect"
	"testing"

	"github.com/hubsync/hubsync/hub"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestAccessProviders(t *testing.T) {
	tmpl, err := ParseServerTemplate("https://cluster-proxy-addon-user.ocm-addon:9092/{{.ClusterName}}")
	if err != nil {
		t.Fatal(err)
	}
	proxy := Provider{Name: "open-cluster-management", Server: tmpl, CA: []byte("CA1"), ClusterNameExtension: true}
	noCA := Provider{Name: "open-cluster-management", Server: tmpl, ClusterNameExtension: true}
	direct := Provider{Name: "direct", Direct: true}
	withClientConfig := testCluster("c1", nil)
	withClientConfig.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: "https://c1.example:6443", CABundle: []byte("C1CA")}}
	plain := testCluster("c1", nil)
	ext := []clientcmdv1.NamedExtension{{Name: hub.ExecExtensionKey, Extension: runtime.RawExtension{Raw: []byte(`{"clusterName":"c1"}`)}}}
	proxyEntry := cpv1alpha1.AccessProvider{Name: "open-cluster-management", Cluster: clientcmdv1.Cluster{
		Server: "https://cluster-proxy-addon-user.ocm-addon:9092/c1", CertificateAuthorityData: []byte("CA1"), Extensions: ext,
	}}
	directEntry := cpv1alpha1.AccessProvider{Name: "direct", Cluster: clientcmdv1.Cluster{Server: "https://c1.example:6443", CertificateAuthorityData: []byte("C1CA")}}
	foreign := cpv1alpha1.AccessProvider{Name: "argocd", Cluster: clientcmdv1.Cluster{Server: "https://elsewhere"}}
	staleProxy := proxyEntry
	staleProxy.Cluster.CertificateAuthorityData = []byte("OLD")
	reencoded := proxyEntry
	reencoded.Cluster.Extensions = []clientcmdv1.NamedExtension{{Name: hub.ExecExtensionKey, Extension: runtime.RawExtension{Raw: []byte(`{ "clusterName": "c1" }`)}}}

	for _, tc := range []struct {
		name      string
		cur       []cpv1alpha1.AccessProvider
		providers []Provider
		cluster   *clusterv1.ManagedCluster
		want      []cpv1alpha1.AccessProvider
	}{
		{name: "no providers configured keeps the list", cur: []cpv1alpha1.AccessProvider{foreign}, cluster: plain, want: []cpv1alpha1.AccessProvider{foreign}},
		{name: "proxy provider added", providers: []Provider{proxy}, cluster: plain, want: []cpv1alpha1.AccessProvider{proxyEntry}},
		{name: "foreign entries kept in place", cur: []cpv1alpha1.AccessProvider{foreign}, providers: []Provider{proxy, direct}, cluster: withClientConfig,
			want: []cpv1alpha1.AccessProvider{foreign, proxyEntry, directEntry}},
		{name: "rotated CA replaces ours in place", cur: []cpv1alpha1.AccessProvider{staleProxy, foreign}, providers: []Provider{proxy}, cluster: plain,
			want: []cpv1alpha1.AccessProvider{proxyEntry, foreign}},
		{name: "re-encoded extension is kept as is", cur: []cpv1alpha1.AccessProvider{reencoded}, providers: []Provider{proxy}, cluster: plain,
			want: []cpv1alpha1.AccessProvider{reencoded}},
		{name: "unknown CA: our entry is removed, others kept", cur: []cpv1alpha1.AccessProvider{staleProxy, foreign}, providers: []Provider{noCA}, cluster: plain,
			want: []cpv1alpha1.AccessProvider{foreign}},
		{name: "direct without client config writes nothing", providers: []Provider{direct}, cluster: plain, want: []cpv1alpha1.AccessProvider{}},
		{name: "duplicate entry of ours collapses", cur: []cpv1alpha1.AccessProvider{proxyEntry, proxyEntry}, providers: []Provider{proxy}, cluster: plain,
			want: []cpv1alpha1.AccessProvider{proxyEntry}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeAccessProviders(tc.cur, tc.providers, tc.cluster)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d entries %+v, want %d %+v", len(got), got, len(tc.want), tc.want)
			}
			for i := range got {
				if !reflect.DeepEqual(got[i], tc.want[i]) {
					t.Errorf("entry %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
