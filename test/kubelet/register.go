package kubelet

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Pod names a pod the fake kubelet runs.
type Pod struct {
	// Node is the Node the pod is bound to (default "fake-node").
	Node string
	// Namespace (default "default") and Name (required) of the pod.
	Namespace, Name string
	// Container is its one container (default "main").
	Container string
}

func (p Pod) withDefaults() (Pod, error) {
	if p.Name == "" {
		return p, fmt.Errorf("fake kubelet: a pod needs a name")
	}
	if p.Node == "" {
		p.Node = "fake-node"
	}
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	if p.Container == "" {
		p.Container = "main"
	}
	return p, nil
}

// Register makes the kube-apiserver that cfg reaches send p's exec,
// attach, port-forward and log requests to this kubelet. It creates or
// updates:
//
//   - the Node p.Node, whose status reports only an InternalIP (k.IP) and
//     the kubelet port (k.Port), so any --kubelet-preferred-address-types
//     that includes InternalIP (the default does) picks it;
//   - the Namespace p.Namespace and its ServiceAccount "default" (for
//     API servers that run the ServiceAccount admission plugin);
//   - the Pod, bound to the node, with status Running and its container
//     running and ready.
//
// The API server must not verify the kubelet's certificate (no
// --kubelet-certificate-authority, as with controlplane.StartManaged) or
// must trust k.CA. It is idempotent, and several pods may share a node.
func (k *Kubelet) Register(ctx context.Context, cfg *rest.Config, p Pod) (*corev1.Pod, error) {
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: client for %s: %w", cfg.Host, err)
	}
	if err := k.registerNode(ctx, kube, p.Node); err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("fake kubelet: create namespace %s: %w", p.Namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: p.Namespace}}
	if _, err := kube.CoreV1().ServiceAccounts(p.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("fake kubelet: create service account %s/default: %w", p.Namespace, err)
	}
	return k.registerPod(ctx, kube, p)
}

func (k *Kubelet) registerNode(ctx context.Context, kube kubernetes.Interface, name string) error {
	now := metav1.Now()
	status := corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: k.IP}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(k.Port)}},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "fake kubelet",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "fake", OperatingSystem: "linux", Architecture: "amd64"},
	}
	nodes := kube.CoreV1().Nodes()
	node, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: status}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("fake kubelet: node %s: %w", name, err)
	}
	// Status on create may be dropped; set it through the subresource.
	node.Status = status
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("fake kubelet: node %s status: %w", name, err)
	}
	return nil
}

func (k *Kubelet) registerPod(ctx context.Context, kube kubernetes.Interface, p Pod) (*corev1.Pod, error) {
	pods := kube.CoreV1().Pods(p.Namespace)
	pod, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
			Spec: corev1.PodSpec{
				NodeName:                     p.Node,
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: p.Container, Image: "fake.invalid/fake-kubelet:latest",
					Stdin: true, // lets `kubectl attach -i` send stdin
				}},
			},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if pod.Spec.NodeName != p.Node {
		return nil, fmt.Errorf("fake kubelet: pod %s/%s exists on node %q, not %q", p.Namespace, p.Name, pod.Spec.NodeName, p.Node)
	}
	now := metav1.Now()
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	statuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		statuses = append(statuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: "fake://" + p.Namespace + "/" + p.Name + "/" + c.Name,
			Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	pod.Status = corev1.PodStatus{
		Phase:             corev1.PodRunning,
		Conditions:        []corev1.PodCondition{cond(corev1.PodScheduled), cond(corev1.PodInitialized), cond(corev1.ContainersReady), cond(corev1.PodReady)},
		HostIP:            k.IP,
		HostIPs:           []corev1.HostIP{{IP: k.IP}},
		StartTime:         &now,
		ContainerStatuses: statuses,
	}
	pod, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: pod %s/%s status: %w", p.Namespace, p.Name, err)
	}
	return pod, nil
}
