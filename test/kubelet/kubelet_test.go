package kubelet_test

import (
	"context"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/kubelet"
)

// managedIP is the managed kube-apiserver's and the fake kubelet's
// address, apart from the other e2e packages' 127.0.0.1x.
const managedIP = "127.0.0.31"

// TestKubectl runs the real kubectl against a real kube-apiserver whose
// pod's node is the fake kubelet: exec, attach, port-forward and logs
// (also followed), over WebSocket and over SPDY.
func TestKubectl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kubectlBin, err := controlplane.KubectlPath()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	mc, err := controlplane.StartManaged(ctx, cp.EtcdURL(), "kubelet1", managedIP)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()

	echo := kubelet.StartEcho(t)
	k, err := kubelet.Start(ctx, kubelet.Options{IP: managedIP, PortForwardTarget: echo, LogInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := k.Close(); err != nil {
			t.Error(err)
		}
	}()
	pod := kubelet.Pod{Namespace: "kubelet-e2e", Name: "p", Container: "main"}
	if _, err := k.Register(ctx, mc.Config, pod); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig, err := controlplane.WriteKubeconfig(dir, "kubeconfig", mc.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc := &kubelet.Kubectl{Bin: kubectlBin, Kubeconfig: kubeconfig, Home: dir, Namespace: pod.Namespace}

	kubelet.Suite(ctx, t, k, kc, pod)
}
