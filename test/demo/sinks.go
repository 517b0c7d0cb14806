package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubsync/hubsync/config"
	hubkeys "github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/webhook"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	demoArgoNamespace = "argocd"
	demoWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

// demoSinks is what the demo's three sinks deliver to: a kubeconfig
// directory, Argo CD's namespace on the hub, and a webhook receiver on
// loopback that verifies every signature.
type demoSinks struct {
	dir  string
	url  string
	srv  *http.Server
	mu   sync.Mutex
	got  []string // "type namespace/cluster" of each event received
	ids  map[string]int
	bad  int // requests whose signature did not verify
	seen time.Time
}

func startDemoSinks(ctx context.Context, hub *fleet.Hub, dir string) (*demoSinks, error) {
	if err := hub.Namespace(ctx, demoArgoNamespace); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &demoSinks{dir: dir, url: "http://" + ln.Addr().String() + "/hubsync", ids: map[string]int{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, os.WriteFile(filepath.Join(dir, "webhook-secrets"), []byte(demoWebhookSecret+"\n"), 0o600)
}

// ServeHTTP is the webhook receiver: it checks the Standard Webhooks
// signature and records the event.
func (s *demoSinks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id, ts, sig := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := webhook.Verify([]string{demoWebhookSecret}, id, ts, body, sig); err != nil {
		s.bad++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var e struct {
		Type    string `json:"type"`
		Subject string `json:"subject"`
	}
	_ = json.Unmarshal(body, &e)
	s.got = append(s.got, strings.TrimPrefix(e.Type, "io.hubsync.")+" "+e.Subject)
	s.ids[id]++
	s.seen = time.Now()
	w.WriteHeader(http.StatusNoContent)
}

// sinks are the demo's sinks: kubeconfig files for kueue-system that
// Kueue's MultiKueue accepts (token auth, CA inline), Argo CD cluster
// Secrets for team-payments, and every event of team-ml to the webhook.
func (s *demoSinks) sinks() []config.Sink {
	return []config.Sink{
		{Name: "multikueue", Type: config.SinkKubeconfig, Filter: config.SinkFilter{Namespaces: []string{"kueue-system"}},
			Kubeconfig: &config.KubeconfigSink{Directory: filepath.Join(s.dir, "kubeconfigs"), AccessProvider: "open-cluster-management",
				ManagedServiceAccount: demoMSA, Consumer: config.ConsumerKueue}},
		{Name: "argocd", Type: config.SinkArgoCD, ArgoCD: &config.ArgoCDSink{Namespace: demoArgoNamespace, ConsumerNamespace: "team-payments",
			AccessProvider: "open-cluster-management", ManagedServiceAccount: demoMSA, Exec: config.ExecAuth{Command: "/usr/local/bin/hubsync"}}},
		{Name: "audit", Type: config.SinkWebhook, Filter: config.SinkFilter{Namespaces: []string{"team-ml"}},
			Webhook: &config.WebhookSink{URL: s.url, SecretsFile: filepath.Join(s.dir, "webhook-secrets"),
				Spool: config.WebhookSpool{Directory: filepath.Join(s.dir, "spool")}}},
	}
}

func (s *demoSinks) close() { _ = s.srv.Close() }

// print shows what each sink holds now.
func (s *demoSinks) print(ctx context.Context, hub *fleet.Hub, d *fleet.Daemon) error {
	step("Sinks: the same changes, delivered to a kubeconfig directory, Argo CD cluster Secrets and a signed webhook")
	// Let the sinks catch up with the last change (they batch for 10 ms).
	// A demo goes on with what is there after 10 s.
	_ = testutil.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() bool {
		m, err := d.Scrape()
		return err == nil && m.Value("hubsync_sink_queue_depth", nil) == 0
	})
	dir := filepath.Join(s.dir, "kubeconfigs")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	fmt.Printf("   multikueue (kubeconfig for Kueue, namespace kueue-system): %d files in %s\n", len(entries), dir)
	for _, e := range entries {
		kc, err := clientcmd.LoadFromFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		fi, _ := e.Info()
		verdict := "Kueue's rules: pass"
		if err := sinks.CheckKueueKubeconfig(kc); err != nil {
			verdict = "Kueue would refuse it: " + err.Error()
		}
		for _, c := range kc.Clusters {
			user := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
			fmt.Printf("     %-34s %v  server %s  token %s  %s\n", e.Name(), fi.Mode(), c.Server,
				hubkeys.TokenFingerprint([]byte(user.Token)), verdict)
		}
	}
	secrets, err := hub.Kube.CoreV1().Secrets(demoArgoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "argocd.argoproj.io/secret-type=cluster"})
	if err != nil {
		return err
	}
	fmt.Printf("   argocd (Secrets in %s for the clusters of team-payments): %d\n", demoArgoNamespace, len(secrets.Items))
	sort.Slice(secrets.Items, func(i, j int) bool { return secrets.Items[i].Name < secrets.Items[j].Name })
	for _, sec := range secrets.Items {
		var cfg struct {
			Exec struct {
				Args []string `json:"args"`
			} `json:"execProviderConfig"`
		}
		_ = json.Unmarshal(sec.Data["config"], &cfg)
		fmt.Printf("     %-28s name=%s server=%s exec args: %s\n", sec.Name, sec.Data["name"], sec.Data["server"], strings.Join(cfg.Exec.Args, " "))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Printf("   audit (webhook, namespace team-ml): %d events received, %d distinct ids, %d bad signatures; the last ones:\n",
		len(s.got), len(s.ids), s.bad)
	for _, g := range s.got[max(0, len(s.got)-6):] {
		fmt.Println("     " + g)
	}
	if m, err := d.Metrics(); err == nil {
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, "hubsync_sink_delivered_total{") || strings.HasPrefix(line, "hubsync_sink_up{") {
				fmt.Println("   " + line)
			}
		}
	}
	return nil
}
