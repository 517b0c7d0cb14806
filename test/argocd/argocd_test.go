// Package argocd_test runs the Argo CD proof (test/argocdproof) against
// Argo CD v3.2.0's own code: it lives in its own module because Argo CD's
// dependency graph is much heavier than hubsync's. v3.2 has no
// provideClusterInfo, so the proof also shows that the switch must stay off
// for it.
package argocd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/db"
	"github.com/argoproj/argo-cd/v3/util/settings"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/test/argocdproof"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestMain removes the hubsync binary testutil builds (in the main
// module, with its own dependency versions: it is what Argo CD runs as
// the exec plugin) once the tests are over.
func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

func TestArgoCDUsesSinkSecrets(t *testing.T) {
	argocdproof.Run(t, argocdproof.ArgoCD{
		Version:  "v3.2.0",
		Read:     read,
		Clusters: clusters,
		ByServer: byServer,
	})
}

// read is what Argo CD v3.2.0 makes of a cluster Secret.
func read(sec *corev1.Secret) (*argocdproof.Cluster, error) {
	c, err := db.SecretToCluster(sec)
	if err != nil {
		return nil, fmt.Errorf("SecretToCluster: %w", err)
	}
	enc, err := json.Marshal(c.Config)
	if err != nil {
		return nil, err
	}
	rc, err := c.RawRestConfig()
	if err != nil {
		return nil, fmt.Errorf("RawRestConfig: %w", err)
	}
	out := &argocdproof.Cluster{
		Name: c.Name, Server: c.Server, Project: c.Project, Namespaces: c.Namespaces,
		ClusterResources: c.ClusterResources, Labels: c.Labels, Config: enc,
		BearerToken: c.Config.BearerToken, REST: rc,
	}
	if e := c.Config.ExecProviderConfig; e != nil {
		out.Exec = &argocdproof.Exec{Command: e.Command, Args: e.Args, Env: e.Env}
	}
	return out, nil
}

// argoDB is Argo CD's cluster database of namespace, over the settings
// informer its controllers use; it stops with ctx.
func argoDB(ctx context.Context, kube kubernetes.Interface, namespace string) db.ArgoDB {
	return db.NewDB(namespace, settings.NewSettingsManager(ctx, kube, namespace), kube)
}

func clusters(ctx context.Context, kube kubernetes.Interface, namespace string) ([]argocdproof.Listed, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	list, err := argoDB(ctx, kube, namespace).ListClusters(ctx)
	if err != nil {
		return nil, err
	}
	var out []argocdproof.Listed
	for _, c := range list.Items {
		out = append(out, listed(&c))
	}
	return out, nil
}

func byServer(ctx context.Context, kube kubernetes.Interface, namespace, server string) (argocdproof.Listed, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := argoDB(ctx, kube, namespace).GetCluster(ctx, server)
	if err != nil {
		return argocdproof.Listed{}, err
	}
	return listed(c), nil
}

func listed(c *appv1.Cluster) argocdproof.Listed {
	return argocdproof.Listed{Name: c.Name, Server: c.Server, ID: c.ID}
}
