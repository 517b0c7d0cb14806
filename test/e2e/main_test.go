// Package e2e tests hubsync against a real kube-apiserver and etcd.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/controlplane"
	"k8s.io/client-go/rest"
)

// hubConfig is the admin config of the control plane shared by the package.
var hubConfig *rest.Config

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := controlplane.Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cannot start the control plane:", err)
		return 1
	}
	fmt.Printf("e2e: kube-apiserver and etcd ready with CRDs in %s\n", time.Since(start).Round(time.Millisecond))
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	}()
	hubConfig = cp.Config
	return m.Run()
}
