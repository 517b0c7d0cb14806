// Package sinks delivers hubsync's change stream to targets outside NATS
// that operators list in the configuration file: kubeconfig files, Argo CD
// cluster Secrets, Kueue MultiKueueClusters and webhooks. Each sink is a
// stream.Consumer with its own queue, retries and metrics (see package
// stream); Manager adds, changes and removes them as the configuration
// changes, without a restart.
//
// The sink types live in sub-packages (sinks/kubeconfig, sinks/argocd,
// sinks/kueue, sinks/webhook); the binary hands Manager a Factory per type,
// so this package knows none of them.
//
// May import config, stream, hub and hubcache; never syncer or bus.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/hubcache"
	"github.com/hubsync/hubsync/stream"
)

// Sink is one configured target of the change stream.
type Sink interface {
	stream.Consumer
	// Close releases what the sink holds (files, connections). It does not
	// remove what the sink wrote: a sink taken out of the configuration
	// leaves its output as it is.
	Close() error
}

// Deps is what sinks may use. Everything is shared; a sink must not
// modify it.
type Deps struct {
	// Kube is the hub client: Argo CD Secrets, credential copies for the
	// token auth mode, webhook secrets from a Secret.
	Kube kubernetes.Interface
	// Cache is the daemon's hub cache, for the sinks that watch the hub
	// (nil: such a sink makes one of its own from Kube).
	Cache *hubcache.Cache
	// Dynamic is the hub's dynamic client, for objects of APIs hubsync
	// does not link (Kueue's MultiKueueClusters).
	Dynamic dynamic.Interface
	// Source is the CloudEvents source of hubsync's events.
	Source string
	Log    *slog.Logger
	// Registerer receives a sink's own metrics (nil: none). Metric names
	// are shared by every sink of a type, labelled by sink name.
	Registerer prometheus.Registerer
	// ResyncPeriod, if set, resyncs the sinks that keep a state (kubeconfig
	// files, Argo CD Secrets) that often: a resync that finds nothing to
	// change writes nothing, and it repairs what changed behind the sink
	// (a file deleted by hand, a cluster label a selector looks at).
	// Webhooks are not resynced on a period: it would send every event of
	// the current state again.
	ResyncPeriod time.Duration
}

// Factory makes a sink of one type from its configuration.
type Factory func(cfg config.Sink, deps Deps) (Sink, error)

// Filter returns the stream filter of a sink's configuration: consumer
// namespaces, a label selector on the managed cluster's labels and event
// types, each empty part selecting everything.
func Filter(f config.SinkFilter) (func(stream.Change) bool, error) {
	var sel labels.Selector
	if f.ClusterSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(f.ClusterSelector)
		if err != nil {
			return nil, fmt.Errorf("cluster selector: %w", err)
		}
		if !s.Empty() {
			sel = s
		}
	}
	namespaces := slices.Clone(f.Namespaces)
	types := slices.Clone(f.EventTypes)
	if sel == nil && len(namespaces) == 0 && len(types) == 0 {
		return nil, nil
	}
	return func(c stream.Change) bool {
		if len(namespaces) > 0 && !slices.Contains(namespaces, c.Namespace) {
			return false
		}
		if len(types) > 0 && !slices.Contains(types, c.Type) {
			return false
		}
		if sel != nil && !sel.Matches(labels.Set(c.ClusterLabels)) {
			return false
		}
		return true
	}, nil
}

// ErrNoToken reports a credential copy that has no token (yet).
var ErrNoToken = errors.New("credential copy has no token")

// Token reads the token of the credential copy of ManagedServiceAccount msa
// for cluster in namespace from the hub. A missing copy or key is
// ErrNoToken (wrapped); the error never holds the token.
func Token(ctx context.Context, kube kubernetes.Interface, namespace, cluster, msa string) (string, error) {
	name := hub.CopyName(cluster, msa)
	sec, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("secret %s/%s: %w", namespace, name, ErrNoToken)
	case err != nil:
		return "", fmt.Errorf("get secret %s/%s: %w", namespace, name, err)
	}
	tok := sec.Data[hub.TokenKey]
	if len(tok) == 0 || sec.Type != corev1.SecretTypeOpaque {
		return "", fmt.Errorf("secret %s/%s: %w", namespace, name, ErrNoToken)
	}
	return string(tok), nil
}

// CredsArgs are the arguments of `hubsync creds` for the synced credential
// of msa for cluster in namespace: everything is named in the arguments, so
// the plugin needs no cluster info from the client (Argo CD v3.2 gives
// none) and no NAMESPACE in its environment.
func CredsArgs(msa, cluster, namespace string) []string {
	return []string{"creds", "--managed-serviceaccount=" + msa, "--cluster=" + cluster, "--namespace=" + namespace}
}

// ClusterInfoCredsArgs are CredsArgs for a client that hands the plugin
// the cluster in KUBERNETES_EXEC_INFO (provideClusterInfo: true, Argo CD
// 3.5 and later): the cluster is not named, so one argument list serves
// every cluster.
func ClusterInfoCredsArgs(msa, namespace string) []string {
	return []string{"creds", "--managed-serviceaccount=" + msa, "--namespace=" + namespace}
}
