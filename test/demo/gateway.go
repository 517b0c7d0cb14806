package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/pki"
)

const (
	// gatewayCluster is reached through the gateway; it shares the first
	// managed API server.
	gatewayCluster = "us-prod-01"
	// The hub identity of the demo: an app's ServiceAccount on the hub.
	gatewayAppNS, gatewayApp = "team-payments", "payments-app"
)

// demoGateway is the access gateway's part of the demo.
type demoGateway struct {
	url, caFile, dir string
	ca               *x509.CertPool
	token            string // the hub app's token
	kubectl          string
}

// startDemoGateway prepares the gateway's certificate and configuration,
// the impersonation grant on the managed API server, and a hub app
// allowed to read ConfigMaps in "payments" there (as its prefixed name).
func startDemoGateway(ctx context.Context, hub *fleet.Hub, managed *controlplane.Managed, dir string) (*demoGateway, config.Gateway, error) {
	g := &demoGateway{dir: dir}
	var err error
	if g.kubectl, err = controlplane.KubectlPath(); err != nil {
		return nil, config.Gateway{}, err
	}
	ca, err := pki.NewCA("hubsync-gateway-ca")
	if err != nil {
		return nil, config.Gateway{}, err
	}
	pair, err := ca.Serving("127.0.0.1")
	if err != nil {
		return nil, config.Gateway{}, err
	}
	certFile, keyFile, err := pair.Write(dir, "gateway")
	if err != nil {
		return nil, config.Gateway{}, err
	}
	if g.caFile, err = ca.WriteCA(dir, "gateway-ca"); err != nil {
		return nil, config.Gateway{}, err
	}
	g.ca = x509.NewCertPool()
	g.ca.AppendCertsFromPEM(ca.PEM)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, config.Gateway{}, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	g.url = "https://" + addr

	// On the managed cluster: the pool's ManagedServiceAccount may
	// impersonate (deploy/gateway/managed-cluster-rbac.yaml's rule), and the
	// app's prefixed name may read ConfigMaps in "payments".
	kube := kubernetes.NewForConfigOrDie(managed.Config)
	objects := []func() error{
		func() error {
			_, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "hubsync-gateway-impersonator"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "hubsync-gateway-impersonator"},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "hubsync-gateway-impersonator"},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: tunnelMSA, Namespace: "open-cluster-management-agent-addon"}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "payments"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			for _, n := range []string{"ledger-config", "fx-rates"} {
				if _, err := kube.CoreV1().ConfigMaps("payments").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
			}
			return nil
		},
		func() error {
			_, err := kube.RbacV1().Roles("payments").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "config-reader"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().RoleBindings("payments").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "payments-app"},
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "config-reader"},
				Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User",
					Name: "cluster:hub:system:serviceaccount:" + gatewayAppNS + ":" + gatewayApp}}}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objects {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, config.Gateway{}, err
		}
	}
	// On the hub: the app's ServiceAccount and a token for it.
	if err := hub.Namespace(ctx, gatewayAppNS); err != nil {
		return nil, config.Gateway{}, err
	}
	if _, err := hub.Kube.CoreV1().ServiceAccounts(gatewayAppNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: gatewayApp}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, config.Gateway{}, err
	}
	secs := int64(3600)
	tr, err := hub.Kube.CoreV1().ServiceAccounts(gatewayAppNS).CreateToken(ctx, gatewayApp,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return nil, config.Gateway{}, err
	}
	g.token = tr.Status.Token
	hub.NoteToken(g.token)
	return g, config.Gateway{Enabled: true, Listen: addr, URL: g.url,
		TLS: config.GatewayTLS{CertFile: certFile, KeyFile: keyFile, CAFile: g.caFile}}, nil
}

// show writes a kubeconfig with `hubsync kubeconfig`, runs the real
// kubectl through it, and shows a forged impersonation refused.
func (g *demoGateway) show(ctx context.Context, binary string, hubHost string) error {
	step(fmt.Sprintf("Access gateway (%s): the hub app %s/%s reaches %s through its warm tunnel, as cluster:hub:<its name>", g.url, gatewayAppNS, gatewayApp, gatewayCluster))
	hubKC := filepath.Join(g.dir, "payments-app-hub.kubeconfig")
	doc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: hub, cluster: {server: %q}}]\nusers: [{name: app, user: {token: %q}}]\ncontexts: [{name: hub, context: {cluster: hub, user: app}}]\ncurrent-context: hub\n", hubHost, g.token)
	if err := os.WriteFile(hubKC, []byte(doc), 0o600); err != nil {
		return err
	}
	kc := filepath.Join(g.dir, gatewayCluster+".kubeconfig")
	args := []string{"kubeconfig", "--cluster", gatewayCluster, "--gateway", g.url, "--ca-file", g.caFile, "--hub-kubeconfig", hubKC, "-o", kc}
	if out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("hubsync kubeconfig: %v: %s", err, out)
	}
	st, err := os.Stat(kc)
	if err != nil {
		return err
	}
	fmt.Printf("   $ hubsync kubeconfig --cluster %s --gateway %s --ca-file gateway-ca.crt   → %s (mode %v, TLS verified, token from an exec plugin)\n",
		gatewayCluster, g.url, filepath.Base(kc), st.Mode().Perm())
	run := func(args ...string) {
		cmd := exec.CommandContext(ctx, g.kubectl, append([]string{"--kubeconfig", kc}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG=")
		out, err := cmd.CombinedOutput()
		fmt.Printf("   $ kubectl %s\n", strings.Join(args, " "))
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			fmt.Println("     " + l)
		}
		if err != nil {
			fmt.Printf("     (exit: %v)\n", err)
		}
	}
	run("auth", "whoami")
	run("get", "configmaps", "-n", "payments")
	run("get", "secrets", "-n", "payments")

	// Clients trying to choose the identity the cluster sees.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: g.ca}}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for _, attempt := range []struct {
		what   string
		header http.Header
	}{
		{"the app's token and Impersonate-User: system:admin, Impersonate-Group: system:masters",
			http.Header{"Authorization": {"Bearer " + g.token}, "Impersonate-User": {"system:admin"}, "Impersonate-Group": {"system:masters"}}},
		{"a JWT the client signed itself and Connection: keep-alive, Authorization (a hop-by-hop list that would drop the credential and reach the cluster as anonymous)",
			http.Header{"Authorization": {"Bearer " + forgedJWT()}, "Connection": {"keep-alive, Authorization"}}},
		{"a JWT the client signed itself",
			http.Header{"Authorization": {"Bearer " + forgedJWT()}}},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+"/"+gatewayCluster+"/api/v1/namespaces/payments/secrets", nil)
		if err != nil {
			return err
		}
		req.Header = attempt.header
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Printf("   a request with %s:\n     %s %s\n", attempt.what, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// forgedJWT is a service-account-shaped JWT signed with a key of the
// client's own.
func forgedJWT() string {
	tok, err := pki.SelfSignedJWT("https://kubernetes.default.svc", "system:serviceaccount:kube-system:admin", "")
	if err != nil {
		panic(err)
	}
	return tok
}
