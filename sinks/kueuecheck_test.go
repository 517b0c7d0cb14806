package sinks

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const secretToken = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.c2lnbmF0dXJl"

// tokenKubeconfig is a kubeconfig Kueue accepts: one cluster with inline
// CA data and an IP-or-DNS host, one user with an inline token.
func tokenKubeconfig() *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["eu-1"] = &clientcmdapi.Cluster{Server: "https://proxy.ocm-addon:9092/eu-1", CertificateAuthorityData: []byte("CA")}
	cfg.AuthInfos["eu-1-kueue"] = &clientcmdapi.AuthInfo{Token: secretToken}
	cfg.Contexts["eu-1"] = &clientcmdapi.Context{Cluster: "eu-1", AuthInfo: "eu-1-kueue"}
	cfg.CurrentContext = "eu-1"
	return cfg
}

// TestCheckKueueKubeconfig breaks each of Kueue's rules in turn: each is
// refused with a message naming it, and no message quotes the token.
func TestCheckKueueKubeconfig(t *testing.T) {
	for _, tc := range []struct {
		name      string
		breakRule func(*clientcmdapi.Config)
		want      string // "" for accepted
	}{
		{name: "token, inline CA, DNS host", breakRule: func(*clientcmdapi.Config) {}},
		{name: "IP host without CA data", breakRule: func(c *clientcmdapi.Config) {
			c.Clusters["eu-1"].Server, c.Clusters["eu-1"].CertificateAuthorityData = "https://10.1.2.3:6443", nil
		}},
		{name: "token file", breakRule: func(c *clientcmdapi.Config) { c.AuthInfos["eu-1-kueue"].TokenFile = "/var/run/token" }, want: "user eu-1-kueue reads a token file"},
		{name: "insecure TLS", breakRule: func(c *clientcmdapi.Config) { c.Clusters["eu-1"].InsecureSkipTLSVerify = true }, want: "cluster eu-1: insecure-skip-tls-verify is set"},
		{name: "CA file", breakRule: func(c *clientcmdapi.Config) { c.Clusters["eu-1"].CertificateAuthority = "/etc/ca.crt" }, want: "cluster eu-1: its CA is a file"},
		{name: "host with an underscore", breakRule: func(c *clientcmdapi.Config) { c.Clusters["eu-1"].Server = "https://proxy_user.ocm:9092/eu-1" },
			want: `cluster eu-1: server host "proxy_user.ocm" is neither an IP address nor a DNS-1123 name`},
		{name: "no server", breakRule: func(c *clientcmdapi.Config) { c.Clusters["eu-1"].Server = "" }, want: "cluster eu-1: no server"},
		{name: "basic auth", breakRule: func(c *clientcmdapi.Config) {
			c.AuthInfos["eu-1-kueue"].Username, c.AuthInfos["eu-1-kueue"].Password = "admin", "hunter2"
		}, want: "user eu-1-kueue uses basic auth"},
		{name: "exec plugin", breakRule: func(c *clientcmdapi.Config) {
			c.AuthInfos["eu-1-kueue"].Exec = &clientcmdapi.ExecConfig{Command: "hubsync", APIVersion: "client.authentication.k8s.io/v1"}
		}, want: "user eu-1-kueue runs an exec plugin"},
		{name: "auth provider", breakRule: func(c *clientcmdapi.Config) {
			c.AuthInfos["eu-1-kueue"].AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}, want: "user eu-1-kueue uses an auth provider"},
		{name: "another user with an exec plugin", breakRule: func(c *clientcmdapi.Config) {
			c.AuthInfos["spare"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "x"}}
		}, want: "user spare runs an exec plugin"},
		{name: "no current context", breakRule: func(c *clientcmdapi.Config) { c.CurrentContext = "" }, want: `the current context "" does not exist`},
		{name: "context naming a missing user", breakRule: func(c *clientcmdapi.Config) { c.Contexts["eu-1"].AuthInfo = "nobody" },
			want: `the current context "eu-1" names a cluster or user that does not exist`},
		{name: "several broken rules", breakRule: func(c *clientcmdapi.Config) {
			c.Clusters["eu-1"].InsecureSkipTLSVerify = true
			c.AuthInfos["eu-1-kueue"].TokenFile = "/t"
		}, want: "cluster eu-1: insecure-skip-tls-verify is set; user eu-1-kueue reads a token file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tokenKubeconfig()
			tc.breakRule(cfg)
			err := CheckKueueKubeconfig(cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
				return
			case err == nil:
				t.Fatalf("accepted, want %q", tc.want)
			case !errors.Is(err, ErrKueueRefuses) || !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q, want ErrKueueRefuses with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secretToken) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error quotes a credential: %v", err)
			}
		})
	}
}

// TestEncodeKubeconfig: the encoding reads back as the same configuration
// and is the same bytes every time, so unchanged contents are not written
// again.
func TestEncodeKubeconfig(t *testing.T) {
	data, err := EncodeKubeconfig(tokenKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, err := EncodeKubeconfig(tokenKubeconfig())
		if err != nil || string(again) != string(data) {
			t.Fatalf("encoding differs from one run to the next: %v", err)
		}
	}
	back, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckKueueKubeconfig(back); err != nil {
		t.Errorf("read back, refused: %v", err)
	}
	if back.AuthInfos["eu-1-kueue"].Token != secretToken || string(back.Clusters["eu-1"].CertificateAuthorityData) != "CA" || back.CurrentContext != "eu-1" {
		t.Errorf("read back as %+v", back)
	}
}
