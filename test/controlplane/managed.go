package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// EtcdURL is the control plane's etcd, which managed API servers share
// under their own key prefixes.
func (c *ControlPlane) EtcdURL() string {
	return c.env.ControlPlane.Etcd.URL.String()
}

// Managed is a kube-apiserver standing for a managed cluster: it listens
// on its own loopback address (127.0.0.0/8 stands for distinct hosts),
// keeps its data in the shared etcd under /managed/<name>, and serves a
// certificate that names its address, "kubernetes.default.svc" (the name
// in-cluster clients and konnectivity agents use) and the cluster's name.
type Managed struct {
	Name string
	// Address is host:port of the secure port.
	Address string
	// CA verifies the serving certificate.
	CA []byte
	// Config is an admin rest.Config (a static token in system:masters).
	Config *rest.Config

	dir      string
	auditLog string
	args     []string
	bin      string
	cmd      *exec.Cmd
	done     chan struct{}
	logs     *os.File
}

// StartManaged starts a managed API server on ip (a free port is chosen)
// and waits until it is ready.
func StartManaged(ctx context.Context, etcdURL, name, ip string) (*Managed, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "managed-"+name+"-")
	if err != nil {
		return nil, err
	}
	m := &Managed{Name: name, dir: dir, bin: filepath.Join(assets, "kube-apiserver")}
	fail := func(err error) (*Managed, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort(ip)
	if err != nil {
		return fail(err)
	}
	m.Address = net.JoinHostPort(ip, strconv.Itoa(port))
	ca, err := pki.NewCA(name + "-ca")
	if err != nil {
		return fail(err)
	}
	m.CA = ca.PEM
	serving, err := ca.Serving(ip, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", name)
	if err != nil {
		return fail(err)
	}
	certFile, keyFile, err := serving.Write(dir, "apiserver")
	if err != nil {
		return fail(err)
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fail(err)
	}
	saFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600); err != nil {
		return fail(err)
	}
	// Every request is audited (metadata only), so that a test can read
	// which identity reached the cluster and with what URL.
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"), 0o600); err != nil {
		return fail(err)
	}
	m.auditLog = filepath.Join(dir, "audit.log")
	token := rand.Text()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return fail(err)
	}
	m.args = []string{
		"--etcd-servers=" + etcdURL, "--etcd-prefix=/managed/" + name,
		"--bind-address=" + ip, "--advertise-address=" + ip, "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile, "--cert-dir=" + dir,
		"--service-account-issuer=https://" + m.Address, "--service-account-key-file=" + saFile,
		"--service-account-signing-key-file=" + saFile, "--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC", "--token-auth-file=" + tokens,
		"--disable-admission-plugins=ServiceAccount",
		"--audit-policy-file=" + policy, "--audit-log-path=" + m.auditLog, "--audit-log-format=json", "--audit-log-mode=blocking",
	}
	m.Config = &rest.Config{Host: "https://" + m.Address, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca.PEM}}
	if err := m.Start(ctx); err != nil {
		return fail(err)
	}
	return m, nil
}

// RotateServiceAccountKey restarts the API server signing new
// ServiceAccount tokens with a new key, while tokens of the old one still
// verify (both are in its key set, as during a real rotation).
func (m *Managed) RotateServiceAccountKey(ctx context.Context) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	file := filepath.Join(m.dir, fmt.Sprintf("sa-%d.key", len(m.args)))
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	if err := m.Stop(); err != nil {
		return err
	}
	for i, a := range m.args {
		if strings.HasPrefix(a, "--service-account-signing-key-file=") {
			m.args[i] = "--service-account-signing-key-file=" + file
		}
	}
	m.args = append(m.args, "--service-account-key-file="+file)
	return m.Start(ctx)
}

// Start starts the API server (again, after Stop) with the same address,
// certificates and data, and waits until it is ready.
func (m *Managed) Start(ctx context.Context) error {
	logs, err := os.OpenFile(filepath.Join(m.dir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		_ = logs.Close()
		return fmt.Errorf("start managed kube-apiserver %s: %w", m.Name, err)
	}
	m.cmd, m.logs, m.done = cmd, logs, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(m.done)
	}()
	if err := m.waitReady(ctx, 90*time.Second); err != nil {
		_ = m.Stop()
		return err
	}
	return nil
}

func (m *Managed) waitReady(ctx context.Context, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(m.CA)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	err := testutil.Poll(ctx, timeout, 100*time.Millisecond, func() error {
		select {
		case <-m.done:
			return testutil.Stop(fmt.Errorf("exited; see %s", m.logs.Name()))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+m.Address+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+m.Config.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("managed kube-apiserver %s not ready: %w", m.Name, err)
	}
	return nil
}

// Stop stops the API server (SIGTERM, then SIGKILL after 20 s).
func (m *Managed) Stop() error {
	if m.cmd == nil {
		return nil
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(20 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	m.cmd = nil
	return m.logs.Close()
}

// Close stops the API server and removes its files.
func (m *Managed) Close() error {
	err := m.Stop()
	return errors.Join(err, os.RemoveAll(m.dir))
}

// ServiceAccountToken creates namespace/name (a ServiceAccount) if needed
// and returns a token for it from the TokenRequest API, for audiences
// (default: the API server's own).
func (m *Managed) ServiceAccountToken(ctx context.Context, namespace, name string, ttl time.Duration, audiences ...string) (string, error) {
	if err := CreateServiceAccount(ctx, m.Config, namespace, name); err != nil {
		return "", err
	}
	kube, err := kubernetes.NewForConfig(m.Config)
	if err != nil {
		return "", err
	}
	secs := int64(ttl.Seconds())
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s on %s: %w", namespace, name, m.Name, err)
	}
	return tr.Status.Token, nil
}

func freePort(ip string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", ip, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// AuditEvent is what a test reads of one audit event.
type AuditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	ImpersonatedUser *struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"impersonatedUser"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// AuditLog returns the audit log as written so far (JSON lines).
func (m *Managed) AuditLog() (string, error) {
	b, err := os.ReadFile(m.auditLog)
	return string(b), err
}

// AuditEvents returns the audited requests whose URI contains marker
// (every stage).
func (m *Managed) AuditEvents(marker string) ([]AuditEvent, error) {
	return readAudit(m.auditLog, func(e AuditEvent) bool { return strings.Contains(e.RequestURI, marker) }, marker)
}

// readAudit returns the events of the audit log at path that keep
// accepts; only lines containing hint ("" for every line) are decoded.
func readAudit(path string, keep func(AuditEvent) bool, hint string) ([]AuditEvent, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []AuditEvent
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || !strings.Contains(line, hint) {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("audit log line: %w", err)
		}
		if keep(e) {
			out = append(out, e)
		}
	}
	return out, nil
}
