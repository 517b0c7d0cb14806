// Package argocd_test runs the Argo CD proof (test/argocdproof) against
// Argo CD v3.6.1's own code, the newest release the module proxy serves;
// it needs Go 1.27 (go.mod's toolchain line). Its exec provider config has
// provideClusterInfo and config, so with the sink's provideClusterInfo on
// Argo CD hands `hubsync creds`, and managed-serviceaccount's cp-creds,
// the cluster in KUBERNETES_EXEC_INFO.
package argocd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/db"
	"github.com/argoproj/argo-cd/v3/util/settings"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/test/argocdproof"
	"github.com/hubsync/hubsync/test/testutil"
)

// cpCredsPackage is managed-serviceaccount's cp-creds, a tool of this
// module (go.mod).
const cpCredsPackage = "open-cluster-management.io/managed-serviceaccount/cmd/clusterprofile-credentials-plugin"

// TestMain removes the hubsync binary testutil builds (in the main
// module, with its own dependency versions: it is what Argo CD runs as
// the exec plugin) once the tests are over.
func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

func TestArgoCDUsesSinkSecrets(t *testing.T) {
	argocdproof.Run(t, argocdproof.ArgoCD{
		Version:             "v3.6.1",
		ProvidesClusterInfo: true,
		Read:                read,
		Clusters:            clusters,
		ByServer:            byServer,
		CPCreds:             cpCreds,
	})
}

// cpCreds builds cp-creds with this module's dependency versions.
func cpCreds(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cp-creds")
	cmd := exec.Command("go", "build", "-o", bin, cpCredsPackage)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", cpCredsPackage, err, out)
	}
	return bin
}

// read is what Argo CD v3.6.1 makes of a cluster Secret.
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
		out.Exec = &argocdproof.Exec{Command: e.Command, Args: e.Args, Env: e.Env, ProvideClusterInfo: e.ProvideClusterInfo}
		if e.Config != nil {
			out.Exec.ClusterConfig = e.Config.Raw
		}
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
