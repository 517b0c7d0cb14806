package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/hub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
)

const testToken = "s3cr3t-t0ken-never-print-me"

var credsNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// execInfo is a KUBERNETES_EXEC_INFO as client-go writes it for a cluster
// whose exec extension names clusterName.
func execInfo(clusterName string) string {
	return fmt.Sprintf(`{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"cluster":{"server":"https://spoke.example:6443","certificate-authority-data":"Q0E=","config":{"clusterName":%q}},"interactive":false}}`, clusterName)
}

// unsignedJWT is a JWT with alg none and the given claims.
func unsignedJWT(t *testing.T, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(payload) + "."
}

func tokenSecret(namespace, name string, annotations map[string]string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: annotations},
		Data:       data,
	}
}

func decodeCredential(t *testing.T, out []byte) *clientauthenticationv1.ExecCredential {
	t.Helper()
	var ec clientauthenticationv1.ExecCredential
	if err := json.Unmarshal(out, &ec); err != nil {
		t.Fatalf("output is not an ExecCredential: %v\n%s", err, out)
	}
	if ec.APIVersion != "client.authentication.k8s.io/v1" || ec.Kind != "ExecCredential" {
		t.Fatalf("apiVersion/kind = %s/%s", ec.APIVersion, ec.Kind)
	}
	if ec.Status == nil {
		t.Fatalf("no status:\n%s", out)
	}
	return &ec
}

func TestCredsCredential(t *testing.T) {
	rfc := func(t time.Time) string { return t.Format(time.RFC3339) }
	jwtExpiringIn := func(d time.Duration) string {
		return unsignedJWT(t, map[string]any{"iss": "kubernetes/serviceaccount", "exp": credsNow.Add(d).Unix()})
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		token       string
		maxCache    time.Duration
		want        time.Time // zero: no expirationTimestamp
		wantWarning string
	}{
		{name: "annotation, margin 30s", token: testToken, maxCache: 0,
			annotations: map[string]string{hub.AnnotationTokenExpiration: rfc(credsNow.Add(time.Hour))},
			want:        credsNow.Add(time.Hour - 30*time.Second)},
		{name: "annotation, margin a tenth of what is left", token: testToken, maxCache: 0,
			annotations: map[string]string{hub.AnnotationTokenExpiration: rfc(credsNow.Add(100 * time.Second))},
			want:        credsNow.Add(90 * time.Second)},
		{name: "annotation wins over the JWT", token: jwtExpiringIn(time.Hour), maxCache: 0,
			annotations: map[string]string{hub.AnnotationTokenExpiration: rfc(credsNow.Add(2 * time.Hour))},
			want:        credsNow.Add(2*time.Hour - 30*time.Second)},
		{name: "JWT exp", token: jwtExpiringIn(time.Hour), maxCache: 0,
			want: credsNow.Add(time.Hour - 30*time.Second)},
		{name: "unreadable annotation falls back to the JWT", token: jwtExpiringIn(time.Hour), maxCache: 0,
			annotations: map[string]string{hub.AnnotationTokenExpiration: "tomorrow"},
			want:        credsNow.Add(time.Hour - 30*time.Second), wantWarning: `hubsync.io/token-expiration="tomorrow" is not an RFC 3339 time`},
		{name: "no expiry known", token: testToken, maxCache: 10 * time.Minute,
			want: credsNow.Add(10 * time.Minute)},
		{name: "JWT without exp", token: unsignedJWT(t, map[string]any{"sub": "x"}), maxCache: 10 * time.Minute,
			want: credsNow.Add(10 * time.Minute)},
		{name: "no expiry known and no cap", token: testToken, maxCache: 0},
		{name: "cap applies", token: jwtExpiringIn(24 * time.Hour), maxCache: 10 * time.Minute,
			want: credsNow.Add(10 * time.Minute)},
		{name: "cap larger than the expiry", token: jwtExpiringIn(5 * time.Minute), maxCache: 10 * time.Minute,
			want: credsNow.Add(5*time.Minute - 30*time.Second)},
		{name: "expired", token: testToken, maxCache: 10 * time.Minute,
			annotations: map[string]string{hub.AnnotationTokenExpiration: rfc(credsNow.Add(-time.Hour))},
			want:        credsNow.Add(time.Second)},
		{name: "expires now", token: jwtExpiringIn(0), maxCache: 10 * time.Minute,
			want: credsNow.Add(time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(tokenSecret("hubns", "c1-msa", tc.annotations, map[string][]byte{
				"token": []byte(tc.token), "ca.crt": []byte("CA"),
			}))
			var stderr bytes.Buffer
			o := defaultCredsOptions(&stderr)
			o.managedServiceAccount = "msa"
			o.maxCache = tc.maxCache
			out, err := o.credential(context.Background(), execInfo("c1"), kube, "hubns", credsNow)
			if err != nil {
				t.Fatal(err)
			}
			ec := decodeCredential(t, out)
			if ec.Status.Token != tc.token {
				t.Errorf("token = %q, want %q", ec.Status.Token, tc.token)
			}
			switch got := ec.Status.ExpirationTimestamp; {
			case tc.want.IsZero() && got != nil:
				t.Errorf("expirationTimestamp = %v, want none", got)
			case !tc.want.IsZero() && got == nil:
				t.Errorf("no expirationTimestamp, want %v", tc.want)
			case got != nil && !got.Time.Equal(tc.want):
				t.Errorf("expirationTimestamp = %v, want %v", got.UTC(), tc.want)
			}
			if tc.wantWarning == "" && stderr.Len() != 0 {
				t.Errorf("unexpected stderr: %s", stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantWarning) {
				t.Errorf("stderr lacks %q: %s", tc.wantWarning, stderr.String())
			}
			if strings.Contains(stderr.String(), tc.token) {
				t.Errorf("stderr contains the token: %s", stderr.String())
			}
		})
	}
}

func TestCredentialExpiration(t *testing.T) {
	now := credsNow.Add(400 * time.Millisecond) // not a whole second
	for _, tc := range []struct {
		name     string
		expiry   time.Time
		maxCache time.Duration
		want     time.Time
	}{
		{name: "unknown, capped", maxCache: time.Minute, want: credsNow.Add(time.Minute)},
		{name: "unknown, no cap", maxCache: 0, want: time.Time{}},
		{name: "unknown, cap under a second", maxCache: 300 * time.Millisecond, want: credsNow.Add(2 * time.Second)},
		{name: "far", expiry: credsNow.Add(time.Hour), want: credsNow.Add(time.Hour - 30*time.Second)},
		{name: "far, capped", expiry: credsNow.Add(time.Hour), maxCache: time.Minute, want: credsNow.Add(time.Minute)},
		{name: "near: a tenth", expiry: credsNow.Add(50 * time.Second), maxCache: time.Minute, want: credsNow.Add(45 * time.Second)},
		{name: "past", expiry: credsNow.Add(-time.Second), maxCache: time.Minute, want: credsNow.Add(2 * time.Second)},
		{name: "just now", expiry: now, maxCache: time.Minute, want: credsNow.Add(2 * time.Second)},
		{name: "rounded down", expiry: now.Add(700 * time.Millisecond), want: credsNow.Add(time.Second)},
		{name: "rounded down onto now", expiry: now.Add(500 * time.Millisecond), want: credsNow.Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := credentialExpiration(tc.expiry, now, tc.maxCache)
			if !got.Equal(tc.want) {
				t.Fatalf("credentialExpiration = %v, want %v", got, tc.want)
			}
			if !got.IsZero() && !got.After(now) {
				t.Fatalf("%v is not after now %v", got, now)
			}
		})
	}
}

func TestCredsNamespace(t *testing.T) {
	dir := t.TempDir()
	saFile := writeFile(t, dir, "namespace", "podns\n")
	blankSAFile := writeFile(t, dir, "blank", " \n")
	kubeconfig := writeFile(t, dir, "kubeconfig", kubeconfigYAML("https://hub.example:6443", "ctxns"))
	noNamespaceKubeconfig := writeFile(t, dir, "kubeconfig-nons", kubeconfigYAML("https://hub.example:6443", ""))
	for _, tc := range []struct {
		name       string
		env        string
		saFile     string
		kubeconfig string
		want       string
	}{
		{name: "NAMESPACE first", env: " envns\n", saFile: saFile, kubeconfig: kubeconfig, want: "envns"},
		{name: "blank NAMESPACE ignored", env: "  ", saFile: saFile, kubeconfig: kubeconfig, want: "podns"},
		{name: "pod namespace file", saFile: saFile, kubeconfig: kubeconfig, want: "podns"},
		{name: "blank pod namespace file ignored", saFile: blankSAFile, kubeconfig: kubeconfig, want: "ctxns"},
		{name: "kubeconfig context", saFile: filepath.Join(dir, "missing"), kubeconfig: kubeconfig, want: "ctxns"},
		{name: "kubeconfig list", saFile: filepath.Join(dir, "missing"),
			kubeconfig: filepath.Join(dir, "missing.yaml") + string(os.PathListSeparator) + kubeconfig, want: "ctxns"},
		{name: "context without namespace", saFile: filepath.Join(dir, "missing"), kubeconfig: noNamespaceKubeconfig, want: "default"},
		{name: "nothing", saFile: filepath.Join(dir, "missing"), kubeconfig: filepath.Join(dir, "missing.yaml"), want: "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("NAMESPACE", tc.env)
			t.Setenv("KUBECONFIG", tc.kubeconfig)
			o := defaultCredsOptions(nil)
			o.serviceAccountNamespaceFile = tc.saFile
			if got := o.namespace(); got != tc.want {
				t.Fatalf("namespace = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCredsErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		execInfo string
		secret   *corev1.Secret
		want     string
	}{
		{name: "secret not found", execInfo: execInfo("c2"),
			secret: tokenSecret("hubns", "c1-msa", nil, map[string][]byte{"token": []byte(testToken)}),
			want:   "secret hubns/c2-msa not found"},
		{name: "secret in another namespace", execInfo: execInfo("c1"),
			secret: tokenSecret("other", "c1-msa", nil, map[string][]byte{"token": []byte(testToken)}),
			want:   "secret hubns/c1-msa not found"},
		{name: "no token key", execInfo: execInfo("c1"),
			secret: tokenSecret("hubns", "c1-msa", nil, map[string][]byte{"ca.crt": []byte(testToken)}),
			want:   `secret hubns/c1-msa has no "token" key`},
		{name: "empty token", execInfo: execInfo("c1"),
			secret: tokenSecret("hubns", "c1-msa", nil, map[string][]byte{"token": {}, "ca.crt": []byte(testToken)}),
			want:   `secret hubns/c1-msa has an empty "token" key`},
		{name: "no exec info", execInfo: "",
			secret: tokenSecret("hubns", "c1-msa", nil, map[string][]byte{"token": []byte(testToken)}),
			want:   "KUBERNETES_EXEC_INFO is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(tc.secret)
			o := defaultCredsOptions(nil)
			o.managedServiceAccount = "msa"
			out, err := o.credential(context.Background(), tc.execInfo, kube, "hubns", credsNow)
			if err == nil {
				t.Fatalf("no error; output %s", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q lacks %q", err, tc.want)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Fatalf("error contains the token: %v", err)
			}
		})
	}
}

func kubeconfigYAML(server, namespace string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: hub
  cluster:
    server: %s
contexts:
- name: hub
  context:
    cluster: hub
    user: hub
    namespace: %q
current-context: hub
users:
- name: hub
  user: {}
`, server, namespace)
}

// fakeHub serves GET of the given Secrets the way an API server does.
func fakeHub(t *testing.T, secrets ...*corev1.Secret) *httptest.Server {
	t.Helper()
	byPath := map[string]*corev1.Secret{}
	for _, s := range secrets {
		byPath[fmt.Sprintf("/api/v1/namespaces/%s/secrets/%s", s.Namespace, s.Name)] = s
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		s, ok := byPath[r.URL.Path]
		if r.Method != http.MethodGet || !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(&metav1.Status{
				TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
				Message: fmt.Sprintf("%s not found", r.URL.Path),
			})
			return
		}
		out := s.DeepCopy()
		out.APIVersion, out.Kind = "v1", "Secret"
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestCredsMain(t *testing.T) {
	hubExpiry := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	srv := fakeHub(t,
		tokenSecret("hubns", "c1-msa", map[string]string{hub.AnnotationTokenExpiration: hubExpiry.Format(time.RFC3339)},
			map[string][]byte{"token": []byte(testToken), "ca.crt": []byte("CA")}),
		tokenSecret("ctxns", "c1-msa", nil, map[string][]byte{"token": []byte(testToken + "-ctx")}),
		tokenSecret("hubns", "c1-notoken", nil, map[string][]byte{"ca.crt": []byte("CA")}),
		tokenSecret("hubns", "c1-empty", nil, map[string][]byte{"token": {}}),
	)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(kubeconfigYAML(srv.URL, "ctxns")), 0o600); err != nil {
		t.Fatal(err)
	}
	v1beta1 := strings.Replace(execInfo("c1"), "client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1", 1)
	for _, tc := range []struct {
		name        string
		args        []string
		execInfo    string
		namespace   string // NAMESPACE
		kubeconfig  string // KUBECONFIG; the fake hub's unless set
		wantCode    int
		wantToken   string
		wantExpiry  time.Time // approximate
		wantStderr  []string
		emptyStderr bool
	}{
		{name: "token with expiry", args: []string{"--managed-serviceaccount=msa", "--max-cache-duration=0"},
			execInfo: execInfo("c1"), namespace: "hubns", wantCode: 0, wantToken: testToken,
			wantExpiry: hubExpiry.Add(-30 * time.Second), emptyStderr: true},
		{name: "default cap", args: []string{"--managed-serviceaccount", "msa"},
			execInfo: execInfo("c1"), namespace: "hubns", wantCode: 0, wantToken: testToken,
			wantExpiry: time.Now().Add(10 * time.Minute), emptyStderr: true},
		{name: "namespace from the kubeconfig context", args: []string{"--managed-serviceaccount=msa"},
			execInfo: execInfo("c1"), wantCode: 0, wantToken: testToken + "-ctx",
			wantExpiry: time.Now().Add(10 * time.Minute), emptyStderr: true},
		{name: "no KUBERNETES_EXEC_INFO", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns",
			wantCode: 1, wantStderr: []string{"KUBERNETES_EXEC_INFO is not set"}},
		{name: "not JSON", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns", execInfo: "{nope",
			wantCode: 1, wantStderr: []string{"KUBERNETES_EXEC_INFO is not an ExecCredential"}},
		{name: "v1beta1", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns", execInfo: v1beta1,
			wantCode: 1, wantStderr: []string{`apiVersion "client.authentication.k8s.io/v1beta1", want "client.authentication.k8s.io/v1"`}},
		{name: "other kind", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns",
			execInfo: strings.Replace(execInfo("c1"), `"kind":"ExecCredential"`, `"kind":"Secret"`, 1),
			wantCode: 1, wantStderr: []string{`kind "Secret"`}},
		{name: "no spec.cluster", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns",
			execInfo: `{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false}}`,
			wantCode: 1, wantStderr: []string{"no spec.cluster", "provideClusterInfo: true"}},
		{name: "no server", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns",
			execInfo: strings.Replace(execInfo("c1"), `"server":"https://spoke.example:6443",`, "", 1),
			wantCode: 1, wantStderr: []string{"no spec.cluster.server"}},
		{name: "no spec.cluster.config", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns",
			execInfo: `{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"cluster":{"server":"https://s"}}}`,
			wantCode: 1, wantStderr: []string{"no spec.cluster.config", "client.authentication.k8s.io/exec"}},
		{name: "no clusterName", args: []string{"--managed-serviceaccount=msa"}, namespace: "hubns", execInfo: execInfo(""),
			wantCode: 1, wantStderr: []string{"no clusterName in spec.cluster.config"}},
		{name: "no --managed-serviceaccount", execInfo: execInfo("c1"), namespace: "hubns",
			wantCode: 2, wantStderr: []string{"--managed-serviceaccount is required", "Usage: hubsync creds"}},
		{name: "empty --managed-serviceaccount", args: []string{"--managed-serviceaccount="}, execInfo: execInfo("c1"), namespace: "hubns",
			wantCode: 2, wantStderr: []string{"--managed-serviceaccount is required"}},
		{name: "negative cap", args: []string{"--managed-serviceaccount=msa", "--max-cache-duration=-1s"}, execInfo: execInfo("c1"),
			namespace: "hubns", wantCode: 2, wantStderr: []string{"must not be negative"}},
		{name: "stray argument", args: []string{"--managed-serviceaccount=msa", "extra"}, execInfo: execInfo("c1"),
			namespace: "hubns", wantCode: 2, wantStderr: []string{"unexpected arguments [extra]"}},
		{name: "unknown flag", args: []string{"--managed-serviceacount=msa"}, execInfo: execInfo("c1"),
			namespace: "hubns", wantCode: 2, wantStderr: []string{"flag provided but not defined"}},
		{name: "help", args: []string{"-h"}, wantCode: 0, wantStderr: []string{"Usage: hubsync creds", "-max-cache-duration"}},
		{name: "secret not found", args: []string{"--managed-serviceaccount=msa"}, execInfo: execInfo("c9"), namespace: "hubns",
			wantCode: 1, wantStderr: []string{"secret hubns/c9-msa not found"}},
		{name: "secret without token", args: []string{"--managed-serviceaccount=notoken"}, execInfo: execInfo("c1"), namespace: "hubns",
			wantCode: 1, wantStderr: []string{`secret hubns/c1-notoken has no "token" key`}},
		{name: "secret with empty token", args: []string{"--managed-serviceaccount=empty"}, execInfo: execInfo("c1"), namespace: "hubns",
			wantCode: 1, wantStderr: []string{`secret hubns/c1-empty has an empty "token" key`}},
		// Argo CD v3.2 runs exec plugins without cluster info: the flags
		// name the cluster and the Secret's namespace.
		{name: "cluster and namespace from flags, no exec info", args: []string{"--managed-serviceaccount=msa", "--cluster=c1", "--namespace=hubns"},
			wantCode: 0, wantToken: testToken, wantExpiry: time.Now().Add(10 * time.Minute), emptyStderr: true},
		{name: "--namespace wins over NAMESPACE", args: []string{"--managed-serviceaccount=msa", "--cluster=c1", "--namespace=ctxns"},
			namespace: "hubns", wantCode: 0, wantToken: testToken + "-ctx", wantExpiry: time.Now().Add(10 * time.Minute), emptyStderr: true},
		{name: "--cluster agreeing with exec info", args: []string{"--managed-serviceaccount=msa", "--cluster=c1"}, execInfo: execInfo("c1"),
			namespace: "hubns", wantCode: 0, wantToken: testToken, wantExpiry: time.Now().Add(10 * time.Minute), emptyStderr: true},
		{name: "--cluster contradicting exec info", args: []string{"--managed-serviceaccount=msa", "--cluster=c1"}, execInfo: execInfo("c2"),
			namespace: "hubns", wantCode: 1, wantStderr: []string{`--cluster "c1" but KUBERNETES_EXEC_INFO names cluster "c2"`}},
		{name: "bad --cluster", args: []string{"--managed-serviceaccount=msa", "--cluster=../x"},
			namespace: "hubns", wantCode: 2, wantStderr: []string{`--cluster "../x" is not a valid cluster name`}},
		{name: "bad --namespace", args: []string{"--managed-serviceaccount=msa", "--cluster=c1", "--namespace=A_B"},
			wantCode: 2, wantStderr: []string{`--namespace "A_B" is not a valid namespace`}},
		{name: "no hub", args: []string{"--managed-serviceaccount=msa"}, execInfo: execInfo("c1"), namespace: "hubns",
			kubeconfig: filepath.Join(dir, "missing"), wantCode: 1, wantStderr: []string{"hub client: not running in a cluster, and no kubeconfig in KUBECONFIG " + filepath.Join(dir, "missing")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("KUBERNETES_EXEC_INFO", tc.execInfo)
			t.Setenv("NAMESPACE", tc.namespace)
			if tc.kubeconfig == "" {
				tc.kubeconfig = kubeconfig
			}
			t.Setenv("KUBECONFIG", tc.kubeconfig)
			var stdout, stderr bytes.Buffer
			// The pod's namespace file is a temp path that does not exist, so
			// the test runs the same inside a pod.
			o := defaultCredsOptions(&stderr)
			o.serviceAccountNamespaceFile = filepath.Join(dir, "no-pod-namespace")
			code := exitCode(o.command(context.Background(), tc.args, &stdout, &stderr), &stderr)
			if code != tc.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tc.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if tc.emptyStderr && stderr.Len() != 0 {
				t.Errorf("unexpected stderr:\n%s", stderr.String())
			}
			if strings.Contains(stderr.String(), testToken) {
				t.Errorf("stderr contains the token:\n%s", stderr.String())
			}
			if tc.wantToken == "" {
				if stdout.Len() != 0 && tc.wantCode != 0 {
					t.Errorf("stdout on failure:\n%s", stdout.String())
				}
				return
			}
			if !strings.HasSuffix(stdout.String(), "}\n") {
				t.Errorf("stdout is not one JSON line: %q", stdout.String())
			}
			ec := decodeCredential(t, stdout.Bytes())
			if ec.Status.Token != tc.wantToken {
				t.Errorf("token = %q, want %q", ec.Status.Token, tc.wantToken)
			}
			if ec.Status.ExpirationTimestamp == nil {
				t.Fatalf("no expirationTimestamp:\n%s", stdout.String())
			}
			if d := ec.Status.ExpirationTimestamp.Sub(tc.wantExpiry); d < -2*time.Second || d > 2*time.Second {
				t.Errorf("expirationTimestamp = %v, want about %v", ec.Status.ExpirationTimestamp.UTC(), tc.wantExpiry.UTC())
			}
		})
	}
}
