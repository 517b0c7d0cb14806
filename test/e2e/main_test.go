// Package e2e tests hubsync against a real kube-apiserver and etcd.
package e2e

import (
	"context"
	"os"
	"testing"

	"github.com/hubsync/hubsync/test/controlplane"
	"k8s.io/client-go/rest"
)

// hubConfig is the admin config of the control plane shared by the
// package; hubPlane is that control plane (its audit log of watches).
var (
	hubConfig *rest.Config
	hubPlane  *controlplane.ControlPlane
)

func TestMain(m *testing.M) {
	os.Exit(controlplane.Main(m, "e2e", func(_ context.Context, s *controlplane.Suite) error {
		hubConfig, hubPlane = s.Hub.Config, s.Hub
		return nil
	}))
}
