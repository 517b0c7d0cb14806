package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	upstreamaccess "sigs.k8s.io/cluster-inventory-api/pkg/access"

	"github.com/hubsync/hubsync/access"
	"github.com/hubsync/hubsync/access/rotations"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// Revoking-rotation figures (flags).
var (
	rotationOnly    bool
	rotationRepeats int
)

const (
	// rotationIP is the managed API server's address (the rolling
	// bench's are .26 and .27).
	rotationIP = "127.0.0.28"
	// The consumer namespace, the cluster, its ManagedServiceAccount and
	// the ServiceAccount on the managed cluster whose tokens it carries.
	rotationNS, rotationCluster, rotationMSA = "rotation-consumer", "rotation-c1", "consumer"
	rotationAgentNS                          = "open-cluster-management-agent-addon"
	// rotationEvery is how often each client sends a GET.
	rotationEvery = 20 * time.Millisecond
	// rotationWait bounds a copy, a refusal and a recovery.
	rotationWait = time.Minute
	// rotationManager is the access provider's name.
	rotationManager = "open-cluster-management"
)

// rotationClient is one long-lived client and what its GETs did since the
// last reset.
type rotationClient struct {
	name  string
	short string // for the per-rotation lines
	get   func(ctx context.Context) error
	src   *access.Source // nil for the exec plugin
	mu    sync.Mutex
	sent  int
	fails []string
	ok    time.Time // the last successful GET
	total struct{ sent, failed int }
}

func (c *rotationClient) run(ctx context.Context) {
	tick := time.NewTicker(rotationEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.get(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		c.sent++
		c.total.sent++
		if err != nil {
			c.fails = append(c.fails, err.Error())
			c.total.failed++
		} else {
			c.ok = time.Now()
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reset returns the GETs sent and failed since the last reset.
func (c *rotationClient) reset() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sent, fails := c.sent, c.fails
	c.sent, c.fails = 0, nil
	return sent, fails
}

func (c *rotationClient) lastOK() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok
}

// rotationRig is the managed cluster, the hub side and hubsync.
type rotationRig struct {
	hub     *fleet.Hub
	managed *controlplane.Managed
	mkube   kubernetes.Interface
	daemon  *fleet.Daemon
	dir     string
	closers []func()
	// tokens holds every token minted, in order; the last is the
	// current one.
	tokens []controlplane.BoundToken
}

// rotationRun is what one revoking rotation measured.
type rotationRun struct {
	copied  time.Duration // hub Secret written -> hubsync's copy holds the token
	refused time.Duration // old token revoked -> the managed cluster refuses it
	sent    []int         // per client
	failed  [][]string    // per client
}

// benchRotation measures what a revoking token rotation costs long-lived
// clients of a managed cluster: a real managed kube-apiserver whose
// ServiceAccount tokens are carried by a ManagedServiceAccount, the real
// hubsync binary copying them next to the ClusterProfile, and clients that
// GET every rotationEvery through the exec plugin (`hubsync creds`, via
// cluster-inventory-api's pkg/access) and through package access. Each
// rotation puts a new token into the hub Secret, waits for hubsync's copy,
// revokes the old token and waits until the cluster refuses it and every
// client has recovered. It prints the failed GETs of each client, with
// the GETs sent, per rotation and in all.
func benchRotation(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) error {
	fmt.Printf("\n== revoking rotations: a managed kube-apiserver, hubsync (the real binary) copying its ManagedServiceAccount's token next to the ClusterProfile; "+
		"each client GETs a namespace every %s over one long-lived connection; %d rotations, each: a new token into the hub Secret, hubsync's copy, "+
		"the old token revoked (its bound Secret deleted) and waited for until the cluster refuses it (kube-apiserver caches a token for ~10s)\n",
		rotationEvery, rotationRepeats)
	begin := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &rotationRig{}
	defer r.close()
	if err := r.setUp(ctx, cp, binary, logs); err != nil {
		return err
	}
	clients, err := r.clients(ctx, cp.Config, binary)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer func() { stopLoad(); wg.Wait() }()
	for _, c := range clients {
		wg.Go(func() { c.run(loadCtx) })
	}
	if err := r.waitRecovered(ctx, clients, time.Now()); err != nil {
		return err
	}
	for _, c := range clients {
		c.reset()
	}
	var runs []rotationRun
	for i := range rotationRepeats {
		run, err := r.rotate(ctx, clients)
		if err != nil {
			return fmt.Errorf("rotation %d: %w", i+1, err)
		}
		run.print(i, clients)
		runs = append(runs, run)
	}
	stopLoad()
	wg.Wait()
	printRotation(runs, clients)
	fmt.Printf("revoking-rotation figures took %s\n", time.Since(begin).Round(time.Second))
	return nil
}

// setUp starts the managed API server, prepares the hub (cluster, set,
// binding, ManagedServiceAccount with a first token) and starts hubsync.
func (r *rotationRig) setUp(ctx context.Context, cp *controlplane.ControlPlane, binary string, logs io.Writer) error {
	var err error
	if r.dir, err = os.MkdirTemp("", "hubsync-bench-rotation-"); err != nil {
		return err
	}
	r.closers = append(r.closers, func() { _ = os.RemoveAll(r.dir) })
	if r.hub, err = fleet.NewHub(cp.Config); err != nil {
		return err
	}
	if r.managed, err = controlplane.StartManaged(ctx, cp.EtcdURL(), rotationCluster, rotationIP); err != nil {
		return err
	}
	r.closers = append(r.closers, func() { _ = r.managed.Close() })
	if r.mkube, err = kubernetes.NewForConfig(r.managed.Config); err != nil {
		return err
	}
	if err := r.agentServiceAccount(ctx); err != nil {
		return err
	}
	if err := r.hubObjects(ctx); err != nil {
		return err
	}
	conf := config.Config{AccessProviders: []config.AccessProvider{{Name: rotationManager, Type: config.ProviderDirect}}}
	if r.daemon, err = fleet.StartDaemon(ctx, binary, cp.Config, conf, logs); err != nil {
		return err
	}
	r.closers = append(r.closers, func() { _ = r.daemon.Stop() })
	if err := r.daemon.WaitReady(ctx, rotationWait); err != nil {
		return err
	}
	_, err = r.waitCopy(ctx, r.tokens[0].Token)
	return err
}

// agentServiceAccount makes the ServiceAccount whose tokens the
// ManagedServiceAccount carries, allowed to get namespaces.
func (r *rotationRig) agentServiceAccount(ctx context.Context) error {
	if err := controlplane.CreateServiceAccount(ctx, r.managed.Config, rotationAgentNS, rotationMSA); err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "rotation-get-namespaces"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}},
	}
	if _, err := r.mkube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "rotation-get-namespaces"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: rotationAgentNS, Name: rotationMSA}},
	}
	if _, err := r.mkube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// hubObjects registers the cluster (its direct endpoint is the managed
// API server), binds it into the consumer namespace and gives its
// ManagedServiceAccount a first token.
func (r *rotationRig) hubObjects(ctx context.Context) error {
	const set = "rotation-set"
	if err := r.hub.CreateExclusiveSet(ctx, set); err != nil {
		return err
	}
	if _, err := r.hub.CreateCluster(ctx, fleet.ClusterSpec{Name: rotationCluster, Labels: fleet.ExclusiveSetLabels(set, nil)}); err != nil {
		return err
	}
	err := r.hub.UpdateCluster(ctx, rotationCluster, func(c *clusterv1.ManagedCluster) {
		c.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: r.managed.Config.Host, CABundle: r.managed.CA}}
	})
	if err != nil {
		return err
	}
	if err := r.hub.Namespace(ctx, rotationNS); err != nil {
		return err
	}
	if err := r.hub.Bind(ctx, rotationNS, set, true); err != nil {
		return err
	}
	if _, err := r.hub.CreateMSA(ctx, rotationCluster, rotationMSA, true); err != nil {
		return err
	}
	return r.putToken(ctx)
}

// putToken mints a new token bound to a Secret of its own on the managed
// cluster (deleting the Secret revokes it) and writes it into the hub
// token Secret, as the agent does on a refresh.
func (r *rotationRig) putToken(ctx context.Context) error {
	name := fmt.Sprintf("rotation-token-%d", len(r.tokens))
	// Ten minutes is the least TokenRequest allows.
	tok, err := controlplane.MintBoundToken(ctx, r.managed.Config, rotationAgentNS, rotationMSA, name, 10*time.Minute)
	if err != nil {
		return err
	}
	r.tokens = append(r.tokens, tok)
	return r.hub.PutToken(ctx, rotationCluster, rotationMSA, "", map[string][]byte{
		hub.TokenKey: []byte(tok.Token), hub.CAKey: r.managed.CA,
	})
}

// waitCopy waits until hubsync's copy holds token and returns how long
// that took.
func (r *rotationRig) waitCopy(ctx context.Context, token string) (time.Duration, error) {
	start := time.Now()
	err := testutil.Poll(ctx, rotationWait, 5*time.Millisecond, func() error {
		sec, err := r.hub.Kube.CoreV1().Secrets(rotationNS).Get(ctx, hub.CopyName(rotationCluster, rotationMSA), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(sec.Data[hub.TokenKey]) != token {
			return fmt.Errorf("the copy holds another token")
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("hubsync's copy: %w", err)
	}
	return time.Since(start), nil
}

// clients builds the long-lived clients: the exec plugin as consumers
// use it today, and package access three ways.
func (r *rotationRig) clients(ctx context.Context, hubConfig *rest.Config, binary string) ([]*rotationClient, error) {
	profileReady := func() error {
		p, err := r.hub.Profiles.ApisV1alpha1().ClusterProfiles(rotationNS).Get(ctx, rotationCluster, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, ap := range p.Status.AccessProviders {
			if ap.Name == rotationManager && ap.Cluster.Server == r.managed.Config.Host {
				return nil
			}
		}
		return fmt.Errorf("profile without the direct access provider")
	}
	if err := testutil.Poll(ctx, rotationWait, 20*time.Millisecond, profileReady); err != nil {
		return nil, err
	}
	plugin, err := r.pluginClient(ctx, hubConfig, binary)
	if err != nil {
		return nil, err
	}
	clients := []*rotationClient{plugin}
	for _, v := range []struct {
		name, short       string
		informer, follows bool
	}{
		{"package access, Source started (its informer follows the copy)", "access", true, false},
		{"package access, Source not started (a 401 -> read the copy -> retry once)", "access without informer", false, false},
		{"package access, Source not started, access/rotations following hubsync's NATS events", "access with NATS events", false, true},
	} {
		c, err := r.accessClient(ctx, hubConfig, v.name, v.informer, v.follows)
		if err != nil {
			return nil, err
		}
		c.short = v.short
		clients = append(clients, c)
	}
	return clients, nil
}

// pluginClient is the exec plugin's client: `hubsync creds` through
// cluster-inventory-api's pkg/access, from a provider file.
func (r *rotationRig) pluginClient(ctx context.Context, hubConfig *rest.Config, binary string) (*rotationClient, error) {
	hubKubeconfig := filepath.Join(r.dir, "hub.kubeconfig")
	if err := fleet.WriteKubeconfig(hubConfig, hubKubeconfig); err != nil {
		return nil, err
	}
	file := map[string]any{"providers": []any{map[string]any{
		"name": rotationManager,
		"execConfig": map[string]any{
			"apiVersion": "client.authentication.k8s.io/v1", "command": binary,
			"args": []string{"creds", "--managed-serviceaccount=" + rotationMSA}, "provideClusterInfo": true,
			"env":             []map[string]string{{"name": "NAMESPACE", "value": rotationNS}, {"name": "KUBECONFIG", "value": hubKubeconfig}},
			"interactiveMode": "Never",
		},
	}}}
	data, err := json.Marshal(file)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(r.dir, "providers.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err
	}
	providers, err := upstreamaccess.NewFromFile(path)
	if err != nil {
		return nil, err
	}
	p, err := r.hub.Profiles.ApisV1alpha1().ClusterProfiles(rotationNS).Get(ctx, rotationCluster, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cfg, err := providers.BuildConfigFromCP(p)
	if err != nil {
		return nil, err
	}
	c, err := r.newClient("exec plugin (`hubsync creds` through cluster-inventory-api pkg/access; client-go runs it again after a 401)", cfg, nil)
	if c != nil {
		c.short = "exec plugin"
	}
	return c, err
}

// accessClient is a client built with package access; its Source runs
// its informer when informer is true, and follows hubsync's NATS events
// with access/rotations when follows is true.
func (r *rotationRig) accessClient(ctx context.Context, hubConfig *rest.Config, name string, informer, follows bool) (*rotationClient, error) {
	src, err := access.New(hubConfig, access.Options{
		Namespace: rotationNS, ManagedServiceAccount: rotationMSA, Provider: rotationManager,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	r.closers = append(r.closers, func() { cancel(); wg.Wait() })
	if informer {
		wg.Go(func() { _ = src.Start(runCtx) })
		if !src.WaitForCacheSync(ctx) {
			return nil, fmt.Errorf("%s: the informer did not sync", name)
		}
	}
	if follows {
		nc, err := nats.Connect(r.daemon.NATSURL)
		if err != nil {
			return nil, fmt.Errorf("connect to hubsync's NATS: %w", err)
		}
		r.closers = append(r.closers, nc.Close)
		wg.Go(func() {
			if err := rotations.Follow(runCtx, nc, src, config.DefaultSubjectPrefix, nil); err != nil {
				fmt.Fprintln(os.Stderr, "bench: follow rotations:", err)
			}
		})
	}
	cfg, err := src.ConfigForName(ctx, rotationCluster)
	if err != nil {
		return nil, err
	}
	return r.newClient(name, cfg, src)
}

// newClient makes a rotationClient that GETs a namespace with cfg.
func (r *rotationRig) newClient(name string, cfg *rest.Config, src *access.Source) (*rotationClient, error) {
	// No client-side throttling: the GETs are paced by rotationEvery.
	cfg.QPS, cfg.Burst = 1000, 1000
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	get := func(ctx context.Context) error {
		_, err := kube.CoreV1().Namespaces().Get(ctx, rotationAgentNS, metav1.GetOptions{})
		return err
	}
	return &rotationClient{name: name, get: get, src: src}, nil
}

// rotate makes one revoking rotation and returns what each client did
// during it.
func (r *rotationRig) rotate(ctx context.Context, clients []*rotationClient) (rotationRun, error) {
	var run rotationRun
	old := r.tokens[len(r.tokens)-1]
	if err := r.putToken(ctx); err != nil {
		return run, err
	}
	var err error
	if run.copied, err = r.waitCopy(ctx, r.tokens[len(r.tokens)-1].Token); err != nil {
		return run, err
	}
	if run.refused, err = controlplane.RevokeBoundToken(ctx, r.managed.Config, old, rotationWait); err != nil {
		return run, err
	}
	if err := r.waitRecovered(ctx, clients, time.Now().Add(time.Second)); err != nil {
		return run, err
	}
	for _, c := range clients {
		sent, fails := c.reset()
		run.sent, run.failed = append(run.sent, sent), append(run.failed, fails)
	}
	return run, nil
}

// waitRecovered waits until every client has succeeded after since.
func (r *rotationRig) waitRecovered(ctx context.Context, clients []*rotationClient, since time.Time) error {
	return testutil.Poll(ctx, rotationWait, 20*time.Millisecond, func() error {
		for _, c := range clients {
			if !c.lastOK().After(since) {
				return fmt.Errorf("%s has not succeeded since %s", c.name, since.Format(time.TimeOnly))
			}
		}
		return nil
	})
}

// close stops what setUp and clients started, last first.
func (r *rotationRig) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

func (run rotationRun) print(i int, clients []*rotationClient) {
	parts := make([]string, len(clients))
	for j, c := range clients {
		parts[j] = fmt.Sprintf("%s %d/%d", c.short, len(run.failed[j]), run.sent[j])
	}
	fmt.Printf("  rotation %2d: copied %s after the hub write, old token refused %.1fs after its revocation; failed/sent GETs: %s\n",
		i+1, run.copied.Round(time.Millisecond), run.refused.Seconds(), strings.Join(parts, ", "))
}

// printRotation prints the failed GETs of each client over every
// rotation, with their spread per rotation, and the copy and refusal
// times.
func printRotation(runs []rotationRun, clients []*rotationClient) {
	fmt.Printf("failed GETs across %d revoking rotations, one long-lived client each, a GET every %s (per rotation: median [min-max]):\n", len(runs), rotationEvery)
	for j, c := range clients {
		var per []float64
		kinds := map[string]int{}
		for _, run := range runs {
			per = append(per, float64(len(run.failed[j])))
			for _, f := range run.failed[j] {
				kinds[f]++
			}
		}
		c.mu.Lock()
		total := c.total
		c.mu.Unlock()
		line := fmt.Sprintf("  %s: %d failed of %d GETs; per rotation %s", c.name, total.failed, total.sent, floatSpread(per, "%.0f"))
		if c.src != nil {
			st := c.src.Stats()
			verdict := "met"
			if total.failed > 0 {
				verdict = "NOT MET"
			}
			line += fmt.Sprintf("; 401s received %d, retried %d, copies read after a 401 %d; goal 0: %s", st.Refused, st.Retried, st.Rereads, verdict)
		}
		for msg, n := range kinds {
			line += fmt.Sprintf("; %dx %q", n, msg)
		}
		fmt.Println(line)
	}
	var copied, refused []time.Duration
	for _, run := range runs {
		copied, refused = append(copied, run.copied), append(refused, run.refused)
	}
	fmt.Printf("hubsync's copy after the hub write: %s; the old token refused after its revocation: %s\n", durationSpread(copied), durationSpread(refused))
}
