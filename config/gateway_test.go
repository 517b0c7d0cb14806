package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGatewayValidation(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "tls.crt")
	key := filepath.Join(dir, "tls.key")
	for _, f := range []string{cert, key} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := `
tunnel:
  enabled: true
  transport: direct
  managedServiceAccount: hubsync-gateway
gateway:
  enabled: true
  url: https://gw.example:8443
  tls: {certFile: ` + cert + `, keyFile: ` + key + `}
`
	tests := []struct {
		name  string
		doc   string
		wants []string // substrings of the error; none: valid
	}{
		{"valid", base, nil},
		{"no tunnel", `
gateway:
  enabled: true
  tls: {certFile: ` + cert + `, keyFile: ` + key + `}
`, []string{"tunnel.enabled: Required", "tunnel.managedServiceAccount: Required"}},
		{"no certificate", `
tunnel: {enabled: true, transport: direct, managedServiceAccount: m}
gateway: {enabled: true}
`, []string{"gateway.tls: Required"}},
		{"both certificate sources", `
tunnel: {enabled: true, transport: direct, managedServiceAccount: m}
gateway:
  enabled: true
  tls: {certFile: ` + cert + `, keyFile: ` + key + `, secret: {namespace: hubsync, name: gw}}
`, []string{"mutually exclusive"}},
		{"bad values", `
tunnel: {enabled: true, transport: direct, managedServiceAccount: m}
gateway:
  enabled: true
  listen: "8443"
  url: http://gw
  passThrough: all
  reviewCacheTTL: 1m
  maxHeaderBytes: 10
  tls: {secret: {namespace: Bad_NS, name: gw}}
`, []string{"gateway.listen", "gateway.url", "gateway.passThrough", "gateway.reviewCacheTTL", "gateway.maxHeaderBytes", "gateway.tls.secret.namespace"}},
		{"bad limits", base + `  maxInFlightReviews: -1
  refusalCacheTTL: 2m
  refusalsPerSecond: -3
  refusalBurst: -1
  hubQPS: -2
  hubBurst: -1
`, []string{"gateway.maxInFlightReviews", "gateway.refusalCacheTTL", "gateway.refusalsPerSecond", "gateway.refusalBurst", "gateway.hubQPS", "gateway.hubBurst"}},
		{"the gateway's hub client may be unlimited", base + "  hubQPS: -1\n", nil},
		{"behind a trusted proxy", base + "  clientAddress: {header: X-Forwarded-For, trustedProxies: [10.0.0.0/8, 'fd00::/8']}\n", nil},
		{"a client header without trusted proxies", base + "  clientAddress: {header: X-Forwarded-For}\n", []string{"gateway.clientAddress.trustedProxies: Required"}},
		{"trusted proxies without a header", base + "  clientAddress: {trustedProxies: [10.0.0.0/8]}\n", []string{"gateway.clientAddress.header: Required"}},
		{"a client header that carries identities", base + "  clientAddress: {header: X-Remote-User, trustedProxies: [10.0.0.0/8]}\n",
			[]string{"gateway.clientAddress.header"}},
		{"a trusted proxy that is not a network", base + "  clientAddress: {header: X-Real-Ip, trustedProxies: [10.0.0.1, lb]}\n",
			[]string{"gateway.clientAddress.trustedProxies[0]", "gateway.clientAddress.trustedProxies[1]"}},
		{"gateway provider without a gateway", `
accessProviders:
- {name: hubsync, type: gateway}
`, []string{"accessProviders[0].type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if len(tt.wants) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded; want errors %q", tt.wants)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestGatewayProviderFilledFromGateway(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "tls.crt")
	if err := os.WriteFile(cert, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(`
tunnel: {enabled: true, transport: direct, managedServiceAccount: m}
gateway:
  enabled: true
  url: https://gw.example:8443/
  tls: {certFile: ` + cert + `, keyFile: ` + cert + `, caFile: ` + cert + `}
accessProviders:
- {name: hubsync, type: gateway}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.AccessProviders[0]
	if p.Server != "https://gw.example:8443/{{.ClusterName}}" || p.CAFile != cert || p.CASecret != nil {
		t.Fatalf("provider = %+v; want the gateway's URL and CA file", p)
	}
	if got, err := RenderServer(p.Server, "c1"); err != nil || got != "https://gw.example:8443/c1" {
		t.Fatalf("RenderServer = %q, %v", got, err)
	}
}

func TestGatewayWarnings(t *testing.T) {
	for _, tt := range []struct {
		name string
		g    Gateway
		warn bool
	}{
		{"off", Gateway{PassThrough: PassThroughJWT}, false},
		{"pass-through without hub issuers", Gateway{Enabled: true, PassThrough: PassThroughJWT}, true},
		{"hub issuers listed", Gateway{Enabled: true, PassThrough: PassThroughJWT, HubIssuers: []string{"https://dex"}}, false},
		{"no pass-through", Gateway{Enabled: true, PassThrough: PassThroughNone}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{Gateway: tt.g}
			got := strings.Join(c.Warnings(), "\n")
			if strings.Contains(got, "gateway.hubIssuers") != tt.warn {
				t.Fatalf("warnings %q; want a hubIssuers warning: %v", got, tt.warn)
			}
		})
	}
}
