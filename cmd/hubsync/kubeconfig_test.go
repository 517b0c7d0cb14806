package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// gatewayConfig is a valid hubsync configuration with the gateway on, but
// for its serving certificate.
const gatewayConfig = `tunnel: {enabled: true, transport: direct, managedServiceAccount: hubsync-gateway}
gateway:
  enabled: true
  url: https://gw.example:8443
`

func TestKubeconfigCommand(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantArgs []string
		wantErr  string
	}{
		{name: "hub identity", args: []string{"--cluster=c1", "--gateway=https://gw.example:8443/", "--ca-file=" + ca, "--hub-kubeconfig=hub.yaml", "--hub-context=admin"},
			wantArgs: []string{"hub-token", "--kubeconfig=" + filepath.Join(mustWd(t), "hub.yaml"), "--context=admin"}},
		{name: "managed service account", args: []string{"--cluster=c1", "--gateway=https://gw.example:8443", "--ca-file=" + ca, "--sa=viewer", "--namespace=team-a"},
			wantArgs: []string{"creds", "--managed-serviceaccount=viewer", "--cluster=c1", "--namespace=team-a"}},
		// The daemon's certificate and key need not exist where this runs.
		{name: "from hubsync's config file", args: []string{"--cluster=c1", "--hub-kubeconfig=hub.yaml", "--config=" + writeConfig(t, gatewayConfig+
			"  tls: {certFile: /not/here.crt, keyFile: /not/here.key, caFile: "+ca+"}\n")},
			wantArgs: []string{"hub-token", "--kubeconfig=" + filepath.Join(mustWd(t), "hub.yaml")}},
		{name: "invalid config file", args: []string{"--cluster=c1", "--config=" + writeConfig(t, gatewayConfig+
			"  tls: {certFile: /not/here.crt, keyFile: /not/here.key}\nlogging: {level: loud}\n")},
			wantErr: "logging.level"},
		{name: "misspelt key in config file", args: []string{"--cluster=c1", "--config=" + writeConfig(t, gatewayConfig+
			"  tls: {certFile: /not/here.crt, keyFile: /not/here.key}\n  caFlie: "+ca+"\n")},
			wantErr: "gateway.caFlie"},
		{name: "no cluster", args: []string{"--gateway=https://gw"}, wantErr: "--cluster is required"},
		{name: "bad cluster", args: []string{"--cluster=../c2", "--gateway=https://gw"}, wantErr: "not a cluster name"},
		{name: "plain http", args: []string{"--cluster=c1", "--gateway=http://gw"}, wantErr: "https://"},
		{name: "no gateway", args: []string{"--cluster=c1"}, wantErr: "gateway's URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "c1.kubeconfig")
			var stdout, stderr bytes.Buffer
			err := kubeconfigCommand(context.Background(), append(tt.args, "-o", out, "--exec-command=/usr/local/bin/hubsync"), &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantErr) {
					t.Fatalf("err %v, stderr %q; want %q", err, stderr.String(), tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, stderr.String())
			}
			st, err := os.Stat(out)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("file mode %v, %v; want 0600", st.Mode(), err)
			}
			kc, err := clientcmd.LoadFromFile(out)
			if err != nil {
				t.Fatal(err)
			}
			ctx := kc.Contexts[kc.CurrentContext]
			cl, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
			if cl.Server != "https://gw.example:8443/c1" || cl.InsecureSkipTLSVerify || len(cl.CertificateAuthorityData) == 0 {
				t.Errorf("cluster = %+v; want the gateway's URL/c1, verified with the CA", cl)
			}
			if user.Token != "" || user.Exec == nil || user.Exec.Command != "/usr/local/bin/hubsync" ||
				strings.Join(user.Exec.Args, " ") != strings.Join(tt.wantArgs, " ") {
				t.Errorf("user = %+v; want exec %q", user.Exec, tt.wantArgs)
			}
		})
	}
}

func mustWd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestHubToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plugin := `{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-plugin"}}`
	tests := []struct {
		name, user, want, wantErr string
	}{
		{name: "token", user: "token: static-token", want: "static-token"},
		{name: "token file", user: "tokenFile: " + tokenFile, want: "from-file"},
		{name: "exec plugin", user: "exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      interactiveMode: Never\n      args:\n      - -c\n      - |\n        echo '" + plugin + "'", want: "from-plugin"},
		{name: "client certificate", user: "client-certificate-data: " + "Zm9v" + "\n    client-key-data: Zm9v", wantErr: "client certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kc := filepath.Join(t.TempDir(), "hub.yaml")
			doc := `apiVersion: v1
kind: Config
clusters: [{name: hub, cluster: {server: "https://127.0.0.1:1"}}]
users:
- name: u
  user:
    ` + tt.user + `
contexts: [{name: hub, context: {cluster: hub, user: u}}]
current-context: hub
`
			if err := os.WriteFile(kc, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			err := hubTokenCommand(context.Background(), []string{"--kubeconfig=" + kc}, &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ec clientauthenticationv1.ExecCredential
			if err := json.Unmarshal(stdout.Bytes(), &ec); err != nil || ec.Status == nil || ec.Status.Token != tt.want {
				t.Fatalf("output %s (%v); want token %q", stdout.String(), err, tt.want)
			}
		})
	}
}
