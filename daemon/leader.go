package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/hubsync/hubsync/config"
)

// identity names this process in the leader Lease: the host name and a
// suffix that keeps two processes on one host (or a restarted pod that
// kept its name) from both believing they hold the lease.
func identity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("leader election identity: %w", err)
	}
	return host + "_" + string(uuid.NewUUID()), nil
}

var leaderInfoDesc = prometheus.NewDesc("hubsync_leader_info",
	"1, labelled with the identity holding the leader Lease as this replica last saw it (this replica's own without leader election).",
	[]string{"identity"}, nil)

// leaderInfo is hubsync_leader_info: one series at most, read at each
// scrape from the election's own record of the holder, so that it names
// the holder the elector last observed. (client-go runs OnNewLeader on a
// goroutine per change, so two quick changes could land out of order.)
type leaderInfo struct {
	mu     sync.Mutex
	holder func() string
}

// set makes the series name id: this replica's own identity without
// leader election.
func (l *leaderInfo) set(id string) { l.follow(func() string { return id }) }

// follow makes the series name whatever holder returns at each scrape.
func (l *leaderInfo) follow(holder func() string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holder = holder
}

func (l *leaderInfo) Describe(ch chan<- *prometheus.Desc) { ch <- leaderInfoDesc }

func (l *leaderInfo) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	holder := l.holder
	l.mu.Unlock()
	if holder == nil {
		return
	}
	if id := holder(); id != "" {
		ch <- prometheus.MustNewConstMetric(leaderInfoDesc, prometheus.GaugeValue, 1, id)
	}
}

// errLeaseLost ends the daemon when this replica stops leading without
// being asked to: the process restarts and rejoins the election with
// clean caches.
var errLeaseLost = errors.New("leader election lost")

// runLeaderElected runs fn while this replica holds the lease, and returns
// once fn has returned and the election has stopped. When ctx ends, fn's
// context is cancelled, and the lease is released only after fn has
// returned, so that a new leader never writes alongside this one's last
// writes. A lease lost while ctx is live cancels fn's context too and is
// errLeaseLost.
func runLeaderElected(ctx context.Context, c config.LeaderElection, kube kubernetes.Interface, id string, log *slog.Logger,
	info *leaderInfo, fn func(context.Context) error) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, c.Namespace, c.Name,
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	lease := c.Namespace + "/" + c.Name
	// client-go runs OnStartedLeading on a goroutine of its own and does
	// not wait for it; fn runs here instead, handed the leader's context.
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaseDuration.Duration,
		RenewDeadline:   c.RenewDeadline.Duration,
		RetryPeriod:     c.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            c.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("became leader", "lease", lease, "identity", id)
				leading <- ctx
			},
			OnStoppedLeading: func() { log.Info("stopped leading", "lease", lease) },
			OnNewLeader: func(leader string) {
				if leader != id {
					log.Info("another replica leads; standing by", "lease", lease, "leader", leader)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	info.follow(le.GetLeader)
	// The election runs on a context of its own: cancelling it releases
	// the lease, which must wait for fn.
	electionCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	elected := make(chan struct{})
	go func() { defer close(elected); le.Run(electionCtx) }()
	defer func() { stopElection(); <-elected }()
	select {
	case <-ctx.Done():
		return nil
	case <-elected:
		return errLeaseLost // ended without leading: cannot happen while ctx is live
	case leaderCtx := <-leading:
		work, cancel := context.WithCancel(leaderCtx)
		defer cancel()
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
		if err := fn(work); err != nil || ctx.Err() != nil {
			return err
		}
		return errLeaseLost
	}
}
