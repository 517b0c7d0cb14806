package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	gw "github.com/hubsync/hubsync/gateway"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestServingCertificateRotation serves the gateway's TLS from files and
// from a Secret on the real hub, rotates each, and polls handshakes until
// the new certificate is served, without a restart.
func TestServingCertificateRotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, err := pki.NewCA("rotation-ca")
	if err != nil {
		t.Fatal(err)
	}
	issue := func() pki.Pair {
		p, err := ca.Serving("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	dir := t.TempDir()
	first, second := issue(), issue()
	certFile, keyFile, err := first.Write(dir, "serving")
	if err != nil {
		t.Fatal(err)
	}
	files, err := gw.NewFileCert(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	files.CheckEvery = 50 * time.Millisecond

	kube := kubernetes.NewForConfigOrDie(env.hub.Config)
	ns := "gateway-cert"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gateway-tls", Namespace: ns}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: first.Cert, corev1.TLSPrivateKeyKey: first.Key, "ca.crt": ca.PEM}}
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fromSecret := &gw.SecretCert{Namespace: ns, Name: "gateway-tls"}
	hc := (&fleet.Hub{Kube: kube}).Cache(t)
	hc.Start(ctx)
	if err := fromSecret.Run(ctx, hc); err != nil {
		t.Fatal(err)
	}

	for _, src := range []struct {
		name   string
		certs  gw.CertSource
		rotate func()
	}{
		{"files", files, func() {
			// As a mounted Secret changes: new files renamed into place.
			for path, data := range map[string][]byte{certFile: second.Cert, keyFile: second.Key} {
				tmp := path + ".new"
				if err := os.WriteFile(tmp, data, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, path); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"secret", fromSecret, func() {
			sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = second.Cert, second.Key
			if _, err := kube.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(src.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			sctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				so := gw.ServerOptionsFor(config.Default().Gateway)
				so.Certs, so.ReadHeaderTimeout = src.certs, time.Second
				done <- gw.Serve(sctx, ln, http.NotFoundHandler(), so)
			}()
			defer func() { stop(); <-done }()
			served := func() (*x509.Certificate, error) {
				roots := x509.NewCertPool()
				roots.AppendCertsFromPEM(ca.PEM)
				c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots})
				if err != nil {
					return nil, err
				}
				defer c.Close()
				return c.ConnectionState().PeerCertificates[0], nil
			}
			want := func(p pki.Pair) string { return mustCert(t, p.Cert).SerialNumber.String() }
			cert, err := served()
			if err != nil || cert.SerialNumber.String() != want(first) {
				t.Fatalf("serves %v, %v; want the first certificate", cert.SerialNumber, err)
			}
			src.rotate()
			testutil.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
				cert, err := served()
				if err != nil {
					return err
				}
				if cert.SerialNumber.String() != want(second) {
					return fmt.Errorf("still serving %v", cert.SerialNumber)
				}
				return nil
			}, "the rotated certificate")
		})
	}
}

func mustCert(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemData)
	if block == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
