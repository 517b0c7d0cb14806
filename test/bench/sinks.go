package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks/kubeconfig"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	argoNamespace = "argocd"
	benchProvider = "proxy"
	// The three sinks of the bench, one of each type.
	sinkFiles = "files"
	sinkArgo  = "argocd"
	sinkHooks = "hooks"
)

// benchProviders is the access provider every bench run writes: a server
// template with a CA file, which the kubeconfig and Argo CD sinks use.
func benchProviders(dir string) ([]config.AccessProvider, error) {
	ca := filepath.Join(dir, "proxy-ca.pem")
	pem := "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUbench\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(ca, []byte(pem), 0o600); err != nil {
		return nil, err
	}
	return []config.AccessProvider{{Name: benchProvider, Server: "https://proxy.example:9092/{{.ClusterName}}", CAFile: ca}}, nil
}

// sinkRig is what a bench run's three sinks deliver to: a kubeconfig
// directory, Argo CD's namespace on the hub, and a webhook receiver on
// loopback. Each run gets a new one, so no run starts with another's
// output.
type sinkRig struct {
	hub  *fleet.Hub
	dir  string
	hook *hookReceiver
	srv  *http.Server
	url  string
}

func newSinkRig(ctx context.Context, hub *fleet.Hub) (*sinkRig, error) {
	dir, err := os.MkdirTemp("", "hubsync-bench-sinks-")
	if err != nil {
		return nil, err
	}
	if err := hub.Namespace(ctx, argoNamespace); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &sinkRig{hub: hub, dir: dir, hook: newHookReceiver()}
	r.srv = &http.Server{Handler: r.hook, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	r.url = "http://" + ln.Addr().String() + "/hubsync"
	secrets := filepath.Join(dir, "whsec")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		return nil, err
	}
	return r, nil
}

// sinks are the three sinks: kubeconfig files for every namespace, Argo
// CD Secrets for the first namespace, and the webhook, with auth exec or
// token for the first two.
func (r *sinkRig) sinks(auth string) []config.Sink {
	return []config.Sink{
		{Name: sinkFiles, Type: config.SinkKubeconfig, Kubeconfig: &config.KubeconfigSink{
			Directory: filepath.Join(r.dir, "kubeconfigs"), AccessProvider: benchProvider, ManagedServiceAccount: msaName, Auth: auth}},
		{Name: sinkArgo, Type: config.SinkArgoCD, ArgoCD: &config.ArgoCDSink{
			Namespace: argoNamespace, ConsumerNamespace: nsName(0), AccessProvider: benchProvider, ManagedServiceAccount: msaName, Auth: auth}},
		{Name: sinkHooks, Type: config.SinkWebhook, Webhook: &config.WebhookSink{
			URL: r.url, SecretsFile: filepath.Join(r.dir, "whsec"), Spool: config.WebhookSpool{Directory: filepath.Join(r.dir, "spool")}}},
	}
}

// only keeps the sinks named.
func (r *sinkRig) only(all []config.Sink, names []string) []config.Sink {
	return slices.DeleteFunc(all, func(s config.Sink) bool { return !slices.Contains(names, s.Name) })
}

// close stops the receiver and removes everything the sinks wrote.
func (r *sinkRig) close(ctx context.Context) error {
	_ = r.srv.Close()
	err := os.RemoveAll(r.dir)
	if derr := r.hub.Kube.CoreV1().Secrets(argoNamespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "argocd.argoproj.io/secret-type=cluster"}); derr != nil {
		err = errors.Join(err, derr)
	}
	return err
}

// waitSinksIdle waits until every sink of the daemon has delivered all it
// was given (queues and the webhook spool empty) and returns how long that
// took.
func waitSinksIdle(ctx context.Context, d *fleet.Daemon, names ...string) (time.Duration, error) {
	start := time.Now()
	err := testutil.Poll(ctx, 10*time.Minute, 50*time.Millisecond, func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		for _, n := range names {
			depth, ok1 := m.Lookup("hubsync_sink_queue_depth", testutil.Labels{"sink": n})
			last, ok2 := m.Lookup("hubsync_sink_last_success_timestamp_seconds", testutil.Labels{"sink": n})
			if !ok1 || !ok2 || depth != 0 || last == 0 {
				return fmt.Errorf("sink %s: queue depth %v, last success %v", n, depth, last)
			}
		}
		if v := m.Value("hubsync_webhook_spool_events", testutil.Labels{"sink": sinkHooks}); v != 0 {
			return fmt.Errorf("%v events in the webhook spool", v)
		}
		return nil
	})
	return time.Since(start), err
}

// hookReceiver is a webhook endpoint that records when each event
// arrives.
type hookReceiver struct {
	mu      sync.Mutex
	n       int
	waiters map[string]chan time.Time // "<type> <namespace>/<cluster>"
}

func newHookReceiver() *hookReceiver { return &hookReceiver{waiters: map[string]chan time.Time{}} }

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	var e struct {
		Type    string `json:"type"`
		Subject string `json:"subject"`
	}
	_ = json.Unmarshal(body, &e)
	h.mu.Lock()
	h.n++
	key := e.Type + " " + e.Subject
	if ch := h.waiters[key]; ch != nil {
		delete(h.waiters, key)
		ch <- at
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// next returns a channel that receives the arrival time of the next event
// of that type about "<namespace>/<cluster>".
func (h *hookReceiver) next(typ, subject string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	h.mu.Lock()
	h.waiters[typ+" "+subject] = ch
	h.mu.Unlock()
	return ch
}

func (h *hookReceiver) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// fileWatcher times when a kubeconfig file first holds an expected token.
type fileWatcher struct {
	w       *fsnotify.Watcher
	mu      sync.Mutex
	waiters map[string]fileWait // file name -> expectation
}

type fileWait struct {
	token string
	done  chan time.Time
}

func newFileWatcher(dir string) (*fileWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return nil, err
	}
	fw := &fileWatcher{w: w, waiters: map[string]fileWait{}}
	go func() {
		for ev := range w.Events {
			name := filepath.Base(ev.Name)
			fw.mu.Lock()
			want, ok := fw.waiters[name]
			fw.mu.Unlock()
			if !ok || !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Rename) && !ev.Has(fsnotify.Write) {
				continue
			}
			at := time.Now()
			kc, err := clientcmd.LoadFromFile(ev.Name)
			if err != nil {
				continue
			}
			for _, a := range kc.AuthInfos {
				if a.Token == want.token {
					fw.mu.Lock()
					delete(fw.waiters, name)
					fw.mu.Unlock()
					want.done <- at
				}
			}
		}
	}()
	return fw, nil
}

func (fw *fileWatcher) expect(name, token string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	fw.mu.Lock()
	fw.waiters[name] = fileWait{token: token, done: ch}
	fw.mu.Unlock()
	return ch
}

// argoWatcher times when an Argo CD cluster Secret first holds an expected
// bearer token, through a watch on Argo CD's namespace.
type argoWatcher struct {
	mu      sync.Mutex
	waiters map[string]fileWait // cluster -> expectation
	stop    chan struct{}
}

func newArgoWatcher(ctx context.Context, cp *controlplane.ControlPlane) (*argoWatcher, error) {
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return nil, err
	}
	aw := &argoWatcher{waiters: map[string]fileWait{}, stop: make(chan struct{})}
	f := kubeinformers.NewSharedInformerFactoryWithOptions(hub.Kube, 0, kubeinformers.WithNamespace(argoNamespace))
	inf := f.Core().V1().Secrets().Informer()
	observe := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		at := time.Now()
		cluster := string(s.Data["name"])
		aw.mu.Lock()
		want, ok := aw.waiters[cluster]
		aw.mu.Unlock()
		if !ok {
			return
		}
		var c struct {
			BearerToken string `json:"bearerToken"`
		}
		if json.Unmarshal(s.Data["config"], &c) == nil && c.BearerToken == want.token {
			aw.mu.Lock()
			delete(aw.waiters, cluster)
			aw.mu.Unlock()
			want.done <- at
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }})
	f.Start(aw.stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(aw.stop)
		return nil, errors.New("argo CD secret watch did not sync")
	}
	return aw, nil
}

func (aw *argoWatcher) expect(cluster, token string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	aw.mu.Lock()
	aw.waiters[cluster] = fileWait{token: token, done: ch}
	aw.mu.Unlock()
	return ch
}

// sinkRotations runs hubsync with the bus and the three sinks in token
// mode (so that a rotation changes every sink's output) on the fleet with
// its credential copies, and times, for single rotations spread over the
// fleet, from the end of the hub write to: the credential.rotated event at
// a NATS subscriber, at the webhook receiver, the kubeconfig file holding
// the new token, and the Argo CD Secret holding it, all in the first
// consumer namespace. Each sink's p99 is also given as a ratio to the NATS
// publish's.
func sinkRotations(ctx context.Context, cp *controlplane.ControlPlane, hub *fleet.Hub, binary string, conf config.Config, logs io.Writer,
	nClusters, nRotations int) error {
	fmt.Printf("\n== sinks: rotation -> delivered, bus + kubeconfig, argocd (both auth: token) and webhook sinks\n")
	rig, err := newSinkRig(ctx, hub)
	if err != nil {
		return err
	}
	defer rig.close(ctx)
	conf.Sinks = rig.sinks(config.AuthToken)
	sub := newEventCounter()
	start := time.Now()
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return err
	}
	defer d.Stop()
	if err := sub.attach(d); err != nil {
		return err
	}
	defer sub.close()
	if err := d.WaitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	if _, err := waitSinksIdle(ctx, d, sinkFiles, sinkArgo, sinkHooks); err != nil {
		return fmt.Errorf("sinks never caught up: %w", err)
	}
	files, _ := os.ReadDir(filepath.Join(rig.dir, "kubeconfigs"))
	argo, err := hub.Kube.CoreV1().Secrets(argoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "argocd.argoproj.io/secret-type=cluster"})
	if err != nil {
		return err
	}
	fmt.Printf("sinks resynced from the current state %s after process start: %d kubeconfig files, %d Argo CD Secrets, %d webhook events\n",
		time.Since(start).Round(time.Millisecond), len(files), len(argo.Items), rig.hook.count())
	fw, err := newFileWatcher(filepath.Join(rig.dir, "kubeconfigs"))
	if err != nil {
		return err
	}
	defer fw.w.Close()
	aw, err := newArgoWatcher(ctx, cp)
	if err != nil {
		return err
	}
	defer close(aw.stop)

	kinds := []string{"nats", "webhook", "kubeconfig", "argocd"}
	lat := map[string][]time.Duration{}
	exp := time.Now().Add(24 * time.Hour)
	ns := nsName(0)
	for i := range nRotations {
		c := clusterName(i * 11 % nClusters)
		tok := fleet.FakeJWT(exp)
		waits := map[string]<-chan time.Time{
			"nats":       sub.next(ns + "/" + c),
			"webhook":    rig.hook.next("io.hubsync.credential.rotated", ns+"/"+c),
			"kubeconfig": fw.expect(kubeconfig.FileName(ns, c), tok),
			"argocd":     aw.expect(c, tok),
		}
		if err := hub.PutToken(ctx, c, msaName, tok, nil); err != nil {
			return err
		}
		t1 := time.Now()
		for _, k := range kinds {
			select {
			case at := <-waits[k]:
				lat[k] = append(lat[k], at.Sub(t1))
			case <-time.After(30 * time.Second):
				return fmt.Errorf("cluster %s: rotation not delivered to %s within 30s", c, k)
			}
		}
	}
	natsP99 := percentile(lat["nats"], 99)
	for _, k := range kinds {
		l := lat[k]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		fmt.Printf("rotation -> %-10s over %d rotations, beyond the hub write: p50 %s p99 %s (%.2fx the NATS publish's p99)\n",
			k, len(l), pct(l, 50), pct(l, 99), percentile(l, 99).Seconds()/natsP99.Seconds())
	}
	fmt.Printf("  (a lone token change is not held for the %s coalescing window; NATS and webhook deliver events, the kubeconfig and Argo CD sinks read the rotated copy from the hub and write)\n", coalesce(conf))
	return nil
}

func percentile(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return pct(s, p)
}
