// Package gateway tests hubsync's access gateway end to end: the real
// hubsync binary serving the gateway over its tunnel pool, the real
// konnectivity proxy-server and agent, a real managed kube-apiserver, a
// real hub kube-apiserver for TokenReview, and the real kubectl.
package gateway

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/konnectivity"
)

// env is what the package's tests share.
var env struct {
	hub     *controlplane.ControlPlane
	server  *konnectivity.Server
	managed *controlplane.Managed
	agent   *konnectivity.Agent
	hubsync string // the binary
	kubectl string
}

// managedIP is the managed API server's address (distinct from the other
// e2e packages', which may run before or after this one).
const managedIP = "127.0.0.21"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "gateway e2e: %s: %v\n", what, err)
		return 1
	}
	var err error
	if env.kubectl, err = controlplane.KubectlPath(); err != nil {
		return fail("kubectl", err)
	}
	dir, err := os.MkdirTemp("", "hubsync-gateway-e2e-")
	if err != nil {
		return fail("temp dir", err)
	}
	defer os.RemoveAll(dir)
	env.hubsync = filepath.Join(dir, "hubsync")
	if out, err := exec.Command("go", "build", "-o", env.hubsync, "github.com/hubsync/hubsync/cmd/hubsync").CombinedOutput(); err != nil {
		return fail("build hubsync", fmt.Errorf("%w\n%s", err, out))
	}
	if env.hub, err = controlplane.Start(ctx); err != nil {
		return fail("cannot start the hub", err)
	}
	defer func() { _ = env.hub.Stop() }()
	if env.server, err = konnectivity.StartServer(ctx, dir); err != nil {
		return fail("cannot start the proxy-server", err)
	}
	defer env.server.Kill()
	if env.managed, err = controlplane.StartManaged(ctx, env.hub.EtcdURL(), "gwmanaged", managedIP); err != nil {
		return fail("cannot start the managed kube-apiserver", err)
	}
	defer env.managed.Close()
	if env.agent, err = env.server.StartAgent("gw-agent", managedIP); err != nil {
		return fail("cannot start the agent", err)
	}
	defer env.agent.Kill()
	fmt.Printf("gateway e2e: hub, proxy-server, managed kube-apiserver and agent ready in %s\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}
