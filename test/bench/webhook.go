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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/fleet"
)

// Webhook figures (flags).
var (
	webhookOnly        bool
	webhookRepeats     int
	webhookDelays      string
	webhookConcurrency string
)

// farReceiver is a webhook endpoint far away: it answers every request
// after a fixed delay. It counts what it takes, and checks that each
// (namespace, cluster) gets its events in order (resourceVersions never go
// back, duplicates dropped by id) and never two at once.
type farReceiver struct {
	delay time.Duration

	mu          sync.Mutex
	n           int // requests answered
	first, last time.Time
	inFlight    int
	most        int
	perKey      map[string]int   // in flight
	lastRV      map[string]int64 // by key, of the events taken so far
	seen        map[string]bool  // ids taken
	outOfOrder  int
	overlaps    int
	dups        int
}

func newFarReceiver(delay time.Duration) *farReceiver {
	return &farReceiver{delay: delay, perKey: map[string]int{}, lastRV: map[string]int64{}, seen: map[string]bool{}}
}

func (f *farReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var e struct {
		ID   string `json:"id"`
		Data struct {
			Namespace       string `json:"namespace"`
			Cluster         string `json:"cluster"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	key := e.Data.Namespace + "/" + e.Data.Cluster
	f.mu.Lock()
	f.inFlight++
	f.most = max(f.most, f.inFlight)
	if f.perKey[key]++; f.perKey[key] > 1 {
		f.overlaps++
	}
	f.mu.Unlock()
	time.Sleep(f.delay)
	rv, _ := strconv.ParseInt(e.Data.ResourceVersion, 10, 64)
	now := time.Now()
	f.mu.Lock()
	f.inFlight--
	f.perKey[key]--
	if f.n == 0 {
		f.first = now
	}
	f.n++
	f.last = now
	switch {
	case f.seen[e.ID]:
		f.dups++
	case rv < f.lastRV[key]:
		f.outOfOrder++
	default:
		f.lastRV[key] = rv
	}
	f.seen[e.ID] = true
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// webhookRun is one initial sync's figures.
type webhookRun struct {
	converged  time.Duration // profiles complete, from hubsync's caches synced
	after      time.Duration // last event delivered after the profiles converged
	events     int
	perSecond  float64 // events delivered per second, first to last
	most       int     // requests in flight at once, at most
	outOfOrder int
	overlaps   int
	dups       int
}

// benchWebhook measures the webhook sink delivering the initial sync of
// the fleet (nClusters x nNamespaces profiles, 4000 by default) to a
// receiver that answers after a fixed delay (--webhook-delays), with each
// --webhook-concurrency, --webhook-repeats times: events per second, and
// how long after the profiles converged the last event was delivered
// (goal: within 5 s at 50 ms), each event of a (namespace, cluster) in
// order, checked by the receiver.
func benchWebhook(ctx context.Context, cp *controlplane.ControlPlane, binary string, nClusters, nNamespaces, workers int, logs io.Writer) error {
	delays, err := parseDurationsMS(webhookDelays)
	if err != nil {
		return fmt.Errorf("--webhook-delays: %w", err)
	}
	concs, err := parseInts(webhookConcurrency, config.DefaultWebhookConcurrency)
	if err != nil {
		return fmt.Errorf("--webhook-concurrency: %w", err)
	}
	profiles := nClusters * nNamespaces
	fmt.Printf("\n== webhook: the initial sync of %d profiles (%d clusters x %d namespaces) to a receiver that answers after a fixed delay, %d runs each\n",
		profiles, nClusters, nNamespaces, webhookRepeats)
	hub, err := fleet.NewHub(cp.Config)
	if err != nil {
		return err
	}
	if err := buildFleet(ctx, hub, nClusters, nNamespaces); err != nil {
		return err
	}
	w, err := newProfileWatcher(ctx, cp, nNamespaces)
	if err != nil {
		return err
	}
	defer w.stop()
	for _, delay := range delays {
		for _, conc := range concs {
			var runs []webhookRun
			for i := range webhookRepeats {
				run, err := webhookSync(ctx, cp, hub, w, binary, delay, conc, workers, profiles, nNamespaces, logs)
				if err != nil {
					return fmt.Errorf("delay %s, concurrency %d, run %d: %w", delay, conc, i+1, err)
				}
				fmt.Printf("  delay %s, concurrency %d, run %d: %d events, %.0f/s, at most %d in flight; converged %s, last event %s after\n",
					delay, conc, i+1, run.events, run.perSecond, run.most, run.converged.Round(time.Millisecond), run.after.Round(time.Millisecond))
				runs = append(runs, run)
			}
			printWebhookRuns(delay, conc, runs)
		}
	}
	return nil
}

// webhookSync runs one initial sync with only a webhook sink to a new
// farReceiver, and removes the profiles after it.
func webhookSync(ctx context.Context, cp *controlplane.ControlPlane, hub *fleet.Hub, w *tracker, binary string,
	delay time.Duration, conc, workers, profiles, nNamespaces int, logs io.Writer) (webhookRun, error) {
	if err := deleteProfiles(ctx, hub, nNamespaces); err != nil {
		return webhookRun{}, err
	}
	w.reset()
	dir, err := os.MkdirTemp("", "hubsync-bench-webhook-")
	if err != nil {
		return webhookRun{}, err
	}
	defer os.RemoveAll(dir)
	recv := newFarReceiver(delay)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return webhookRun{}, err
	}
	srv := &http.Server{Handler: recv, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	secrets := filepath.Join(dir, "whsec")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		return webhookRun{}, err
	}
	conf := config.Config{}
	conf.Workers.Topology = workers
	conf.Credentials.Workers = workers
	conf.Sinks = []config.Sink{{Name: sinkHooks, Type: config.SinkWebhook, Webhook: &config.WebhookSink{
		URL: "http://" + ln.Addr().String() + "/hubsync", SecretsFile: secrets, Concurrency: conc,
		Spool: config.WebhookSpool{Directory: filepath.Join(dir, "spool")}}}}
	d, err := fleet.StartDaemon(ctx, binary, cp.Config, conf, logs)
	if err != nil {
		return webhookRun{}, err
	}
	defer func() { _ = d.Stop() }()
	readyAt := d.ReadyAt(ctx)
	if err := w.waitCount(ctx, d.Done(), profiles, 10*time.Minute); err != nil {
		return webhookRun{}, err
	}
	converged := time.Now()
	if _, err := waitSinksIdle(ctx, d, sinkHooks); err != nil {
		return webhookRun{}, fmt.Errorf("the webhook never caught up: %w", err)
	}
	if err := d.Stop(); err != nil {
		return webhookRun{}, fmt.Errorf("stop hubsync: %w", err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	run := webhookRun{
		converged: converged.Sub(<-readyAt), after: max(recv.last.Sub(converged), 0), events: recv.n, most: recv.most,
		outOfOrder: recv.outOfOrder, overlaps: recv.overlaps, dups: recv.dups,
	}
	if span := recv.last.Sub(recv.first).Seconds(); span > 0 {
		run.perSecond = float64(recv.n) / span
	}
	if run.outOfOrder > 0 || run.overlaps > 0 {
		return run, fmt.Errorf("%d events out of order, %d of a key in flight at once", run.outOfOrder, run.overlaps)
	}
	return run, nil
}

// printWebhookRuns prints the median and spread of one delay's runs.
func printWebhookRuns(delay time.Duration, conc int, runs []webhookRun) {
	var after, converged []time.Duration
	var rate []float64
	var dups, most int
	for _, r := range runs {
		after, converged, rate = append(after, r.after), append(converged, r.converged), append(rate, r.perSecond)
		dups += r.dups
		most = max(most, r.most)
	}
	slices.Sort(after)
	slices.Sort(converged)
	slices.Sort(rate)
	goal, ceiling := "", ""
	if delay == 50*time.Millisecond {
		goal = " (goal <= 5s at 50 ms)"
	}
	if delay > 0 {
		// What the sink could take at most: concurrency round trips at once.
		ceiling = fmt.Sprintf(" (ceiling %.0f/s)", float64(conc)/delay.Seconds())
	}
	fmt.Printf("webhook, receiver %s away, concurrency %d: %.0f events/s%s (median; %.0f to %.0f), the last event %s after the profiles converged (median; %s to %s)%s; convergence %s (%s to %s); order per key checked: in order, never two of a key at once; at most %d in flight, %d duplicates\n",
		delay, conc, median(rate), ceiling, rate[0], rate[len(rate)-1],
		median(after).Round(10*time.Millisecond), after[0].Round(10*time.Millisecond), after[len(after)-1].Round(10*time.Millisecond), goal,
		median(converged).Round(100*time.Millisecond), converged[0].Round(100*time.Millisecond), converged[len(converged)-1].Round(100*time.Millisecond),
		most, dups)
}

// webhookOnFreshHub runs the webhook figures on a control plane of their
// own (the full run's hub holds the credential figures' copies by then).
func webhookOnFreshHub(ctx context.Context, binary string, nClusters, nNamespaces, workers int, logs io.Writer) error {
	fmt.Println("\n== webhook: starting a kube-apiserver + etcd of its own")
	cp, err := controlplane.Start(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	return benchWebhook(ctx, cp, binary, nClusters, nNamespaces, workers, logs)
}

// parseDurationsMS reads milliseconds separated by commas.
func parseDurationsMS(s string) ([]time.Duration, error) {
	ms, err := parseInts(s, -1)
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		if m < 0 {
			return nil, errors.New("a delay is at least 0")
		}
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out, nil
}

// parseInts reads integers separated by commas; an empty list is def.
func parseInts(s string, def int) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		out = []int{def}
	}
	return out, nil
}
