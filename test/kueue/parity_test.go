package kueue_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/test/testutil"
)

// insecureKubeConfig is the reason Kueue gives a MultiKueueCluster whose
// kubeconfig its validateKubeconfig refuses.
const insecureKubeConfig = "InsecureKubeConfig"

// proveRuleParity checks hubsync's own copy of Kueue's kubeconfig rules
// (sinks.CheckKueueKubeconfig, which the kueue sink and the kubeconfig
// sink's consumer kueue apply before writing) against Kueue's
// validateKubeconfig, one kubeconfig per rule: each is read by Kueue
// through a MultiKueueCluster of locationType Path, and Kueue's verdict
// (inactive with reason InsecureKubeConfig, or past validation) must be
// hubsync's. A check more lenient than Kueue's would let hubsync write
// files Kueue refuses; a stricter one would refuse files Kueue takes.
func proveRuleParity(t *testing.T, k *kueueController) {
	// Nothing listens on the servers that pass: a kubeconfig past
	// validation ends in ClientConnectionFailed, which is not a refusal.
	base := func(server string) *clientcmdapi.Config {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: suite.worker.m.CA}
		cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "not-a-token"}
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		cfg.CurrentContext = "c"
		return cfg
	}
	cases := []struct {
		name    string
		cfg     *clientcmdapi.Config
		mutate  func(*clientcmdapi.Config)
		refused bool
	}{
		{"inline-token-ip", base("https://127.0.0.1:1"), nil, false},
		{"dns-name", base("https://localhost:1"), nil, false},
		{"upper-case-name", base("https://LOCALHOST:1"), nil, false},
		{"underscore-host", base("https://local_host:1"), nil, true},
		{"exec-plugin", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) {
			c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "hubsync", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}}
		}, true},
		{"token-file", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) { c.AuthInfos["u"].TokenFile = "/var/run/token" }, true},
		{"insecure-tls", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) {
			c.Clusters["c"].CertificateAuthorityData, c.Clusters["c"].InsecureSkipTLSVerify = nil, true
		}, true},
		{"ca-file", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) {
			c.Clusters["c"].CertificateAuthorityData, c.Clusters["c"].CertificateAuthority = nil, "/etc/ca.crt"
		}, true},
		{"basic-auth", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) {
			c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Username: "admin", Password: "secret"}
		}, true},
		{"auth-provider", base("https://127.0.0.1:1"), func(c *clientcmdapi.Config) {
			c.AuthInfos["u"] = &clientcmdapi.AuthInfo{AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc"}}
		}, true},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		if tc.mutate != nil {
			tc.mutate(tc.cfg)
		}
		data, err := clientcmd.Write(*tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, tc.name+".kubeconfig")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		k.pathCluster(t, "parity-"+tc.name, path)
	}
	for _, tc := range cases {
		kueueRefused := kueueVerdict(t, k, "parity-"+tc.name)
		hubsyncErr := sinks.CheckKueueKubeconfig(tc.cfg)
		if kueueRefused != tc.refused {
			t.Errorf("%s: Kueue refused it: %v, want %v", tc.name, kueueRefused, tc.refused)
		}
		if (hubsyncErr != nil) != kueueRefused {
			t.Errorf("%s: Kueue refused it: %v, hubsync's check: %v", tc.name, kueueRefused, hubsyncErr)
		}
	}
}

// kueueVerdict waits until Kueue has read the MultiKueueCluster's
// kubeconfig and says whether it refused it (InsecureKubeConfig) or let it
// through validation (Active, or a failed connection).
func kueueVerdict(t *testing.T, k *kueueController, name string) bool {
	t.Helper()
	var refused bool
	testutil.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		c, err := k.active(t.Context(), name)
		if err != nil {
			return err
		}
		switch {
		case c.Status == metav1.ConditionFalse && c.Reason == insecureKubeConfig:
			refused = true
		case c.Status == metav1.ConditionTrue || c.Reason == "ClientConnectionFailed":
			refused = false
		default:
			return fmt.Errorf("Active %s: %s: %s", c.Status, c.Reason, c.Message)
		}
		return nil
	}, "Kueue's verdict on MultiKueueCluster %s", name)
	return refused
}
