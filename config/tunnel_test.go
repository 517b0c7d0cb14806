package config

import (
	"strings"
	"testing"
)

func TestTunnelConfig(t *testing.T) {
	const konn = `
tunnel:
  enabled: true
  konnectivity:
    address: proxy:8090
    caFile: /ca
    certFile: /crt
    keyFile: /key
`
	tests := []struct {
		name    string
		doc     string
		wantErr []string // every one must appear; none: valid
	}{
		{name: "off by default needs nothing", doc: ``},
		{name: "konnectivity with mutual TLS", doc: konn},
		{name: "direct needs no proxy-server", doc: "tunnel: {enabled: true, transport: direct}"},
		{name: "custom dial address", doc: konn + "    dialAddress: '{{.ServerHost}}'\n"},
		{name: "konnectivity without address or TLS", doc: "tunnel: {enabled: true}",
			wantErr: []string{"tunnel.konnectivity.address: Required", "tunnel.konnectivity.caFile: Required"}},
		{name: "konnectivity without a client certificate", doc: "tunnel: {enabled: true, konnectivity: {address: 'proxy:8090', caFile: /ca}}",
			wantErr: []string{"tunnel.konnectivity.certFile: Required", "tunnel.konnectivity.keyFile: Required"}},
		{name: "konnectivity without its key", doc: "tunnel: {enabled: true, konnectivity: {address: 'proxy:8090', caFile: /ca, certFile: /crt}}",
			wantErr: []string{"tunnel.konnectivity.keyFile: Required"}},
		{name: "unknown transport", doc: "tunnel: {transport: ssh}", wantErr: []string{`tunnel.transport: Unsupported value: "ssh"`}},
		{name: "dial address with an unknown field", doc: konn + "    dialAddress: '{{.Cluster}}:443'\n",
			wantErr: []string{"tunnel.konnectivity.dialAddress", "ClusterName"}},
		{name: "dial address without a port", doc: konn + "    dialAddress: '{{.ClusterName}}'\n",
			wantErr: []string{"tunnel.konnectivity.dialAddress", "not host:port"}},
		{name: "timeouts and bounds", doc: "tunnel: {probeInterval: 1s, probeTimeout: 2s, maxConcurrentDials: -1, maxConnectionsPerCluster: 65, probePath: version, backoff: {baseDelay: 10s, maxDelay: 1s}}",
			wantErr: []string{"tunnel.probeTimeout", "tunnel.maxConcurrentDials", "tunnel.maxConnectionsPerCluster", "tunnel.probePath", "tunnel.backoff.maxDelay"}},
		{name: "bad selector and MSA name", doc: "tunnel: {managedServiceAccount: Not_Valid, clusterSelector: {matchExpressions: [{key: a, operator: Near}]}}",
			wantErr: []string{"tunnel.managedServiceAccount", "tunnel.clusterSelector"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted %q", tt.doc)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
