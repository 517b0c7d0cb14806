package sinks

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

func TestFilter(t *testing.T) {
	c := func(ns, typ string, labels map[string]string) stream.Change {
		return stream.Change{Type: typ, Namespace: ns, Cluster: "c1", ClusterLabels: labels}
	}
	prod := map[string]string{"env": "prod"}
	tests := []struct {
		name   string
		filter config.SinkFilter
		change stream.Change
		want   bool
	}{
		{name: "empty selects all", change: c("a", stream.ProfileCreated, nil), want: true},
		{name: "namespace in", filter: config.SinkFilter{Namespaces: []string{"a", "b"}}, change: c("b", stream.ProfileCreated, nil), want: true},
		{name: "namespace out", filter: config.SinkFilter{Namespaces: []string{"a"}}, change: c("b", stream.ProfileCreated, nil)},
		{name: "type in", filter: config.SinkFilter{EventTypes: []string{stream.CredentialRotated}}, change: c("a", stream.CredentialRotated, nil), want: true},
		{name: "type out", filter: config.SinkFilter{EventTypes: []string{stream.CredentialRotated}}, change: c("a", stream.ProfileUpdated, nil)},
		{name: "selector matches the cluster's labels", filter: config.SinkFilter{ClusterSelector: &metav1.LabelSelector{MatchLabels: prod}},
			change: c("a", stream.ProfileUpdated, prod), want: true},
		{name: "selector, other labels", filter: config.SinkFilter{ClusterSelector: &metav1.LabelSelector{MatchLabels: prod}},
			change: c("a", stream.ProfileUpdated, map[string]string{"env": "dev"})},
		{name: "selector, no labels known", filter: config.SinkFilter{ClusterSelector: &metav1.LabelSelector{MatchLabels: prod}},
			change: c("a", stream.ProfileUpdated, nil)},
		{name: "empty selector selects all", filter: config.SinkFilter{ClusterSelector: &metav1.LabelSelector{}}, change: c("a", stream.ProfileUpdated, nil), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Filter(tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if got := f == nil || f(tt.change); got != tt.want {
				t.Errorf("selected = %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := Filter(config.SinkFilter{ClusterSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}); err == nil {
		t.Error("a bad selector was accepted")
	}
}

// fakeSink records what it is given and whether it was closed.
type fakeSink struct {
	name    string
	mu      sync.Mutex
	got     []stream.Change
	resyncs int
	closed  bool
}

func (f *fakeSink) Deliver(_ context.Context, cs []stream.Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, cs...)
	return nil
}

func (f *fakeSink) Resync(context.Context, []stream.Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resyncs++
	return nil
}

func (f *fakeSink) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// startedFanout is a running fan-out whose state is known and empty.
func startedFanout(t *testing.T) (context.Context, *stream.Fanout) {
	t.Helper()
	fan, err := stream.NewFanout(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := fan.Start(ctx, func() []stream.Change { return []stream.Change{} }); err != nil {
		t.Fatal(err)
	}
	return ctx, fan
}

func TestManagerApply(t *testing.T) {
	ctx, fan := startedFanout(t)
	var mu sync.Mutex
	built := map[string][]*fakeSink{}
	factory := func(cfg config.Sink, _ Deps) (Sink, error) {
		if cfg.Webhook != nil && cfg.Webhook.URL == "https://broken" {
			return nil, errors.New("cannot build")
		}
		mu.Lock()
		defer mu.Unlock()
		s := &fakeSink{name: cfg.Name}
		built[cfg.Name] = append(built[cfg.Name], s)
		return s, nil
	}
	m := NewManager(fan, Deps{Log: slog.New(slog.DiscardHandler)}, map[string]Factory{config.SinkWebhook: factory, config.SinkArgoCD: factory})
	hook := func(name, url string) config.Sink {
		return defaulted(config.Sink{Name: name, Type: config.SinkWebhook, Webhook: &config.WebhookSink{URL: url}})
	}
	argo := defaulted(config.Sink{Name: "argo", Type: config.SinkArgoCD, ArgoCD: &config.ArgoCDSink{ConsumerNamespace: "team-a"}})

	res, err := m.Apply([]config.Sink{hook("a", "https://a"), hook("b", "https://b"), argo})
	if err != nil || !slices.Equal(res.Added, []string{"a", "b", "argo"}) {
		t.Fatalf("first apply: %+v, %v", res, err)
	}
	res, err = m.Apply([]config.Sink{hook("a", "https://a"), hook("b", "https://b2"), hook("c", "https://broken"), argo})
	if err == nil || !slices.Equal(res.Changed, []string{"b"}) || !slices.Equal(res.Unchanged, []string{"a", "argo"}) || !slices.Equal(res.Failed, []string{"c"}) {
		t.Fatalf("second apply: %+v, %v", res, err)
	}
	if !built["b"][0].closed || built["a"][0].closed || len(built["b"]) != 2 {
		t.Fatalf("the changed sink was not replaced (or another was closed)")
	}
	res, err = m.Apply([]config.Sink{hook("b", "https://b2"), argo})
	if err != nil || !slices.Equal(res.Removed, []string{"a"}) {
		t.Fatalf("third apply: %+v, %v", res, err)
	}
	if !built["a"][0].closed || fan.Has("a") || fan.Has("c") {
		t.Fatal("removed or failed sinks are still there")
	}
	// The Argo CD sink only gets its consumer namespace's changes.
	fan.Notify(stream.Change{Type: stream.ProfileCreated, Namespace: "team-a", Cluster: "c1", Name: "c1"})
	fan.Notify(stream.Change{Type: stream.ProfileCreated, Namespace: "team-b", Cluster: "c1", Name: "c1"})
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if err := fan.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	a := built["argo"][0]
	a.mu.Lock()
	if len(a.got) != 1 || a.got[0].Namespace != "team-a" || a.resyncs != 1 {
		t.Errorf("argo sink got %+v after %d resyncs", a.got, a.resyncs)
	}
	a.mu.Unlock()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if !built["b"][1].closed || !a.closed || len(m.Names()) != 0 {
		t.Error("Close left sinks open")
	}
}

// Sinks that keep a state are resynced on the configured period; webhooks
// are not (a resync would send every event of the current state again).
func TestPeriodicResyncSkipsWebhooks(t *testing.T) {
	_, fan := startedFanout(t)
	var mu sync.Mutex
	built := map[string]*fakeSink{}
	factory := func(cfg config.Sink, _ Deps) (Sink, error) {
		mu.Lock()
		defer mu.Unlock()
		built[cfg.Name] = &fakeSink{name: cfg.Name}
		return built[cfg.Name], nil
	}
	m := NewManager(fan, Deps{Log: slog.New(slog.DiscardHandler), ResyncPeriod: 20 * time.Millisecond},
		map[string]Factory{config.SinkWebhook: factory, config.SinkKubeconfig: factory})
	defer m.Close()
	if _, err := m.Apply([]config.Sink{
		defaulted(config.Sink{Name: "hooks", Type: config.SinkWebhook, Webhook: &config.WebhookSink{}}),
		defaulted(config.Sink{Name: "files", Type: config.SinkKubeconfig, Kubeconfig: &config.KubeconfigSink{}}),
	}); err != nil {
		t.Fatal(err)
	}
	resyncs := func(name string) int {
		mu.Lock()
		s := built[name]
		mu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.resyncs
	}
	testutil.Eventually(t, 10*time.Second, 5*time.Millisecond, func() bool { return resyncs("files") >= 3 },
		"kubeconfig sink did not resync 3 times")
	if n := resyncs("hooks"); n != 1 {
		t.Errorf("webhook sink resynced %d times, want only its first", n)
	}
}

// defaulted fills a sink's defaults, as a loaded configuration has them:
// the manager takes them from there, having none of its own.
func defaulted(s config.Sink) config.Sink {
	c := config.Config{Sinks: []config.Sink{s}}
	c.SetDefaults()
	return c.Sinks[0]
}
