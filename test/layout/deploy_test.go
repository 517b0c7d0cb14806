package layout

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
)

// stopMargin is what a replica's stop takes beyond the gateway's drain:
// the cut requests' handlers returning, the tunnel pool and the health
// server closing. terminationGracePeriodSeconds must leave it.
const stopMargin = 5 * time.Second

// deployHA is what deploy/ says about running highly available.
type deployHA struct {
	deploy appsv1.StatefulSet
	pdb    policyv1.PodDisruptionBudget
	cfg    *config.Config
}

// readDeployHA reads deploy/statefulset.yaml, pdb.yaml and the
// configuration config.yaml holds (decoded and defaulted as the daemon
// does, without checking the files it names).
func readDeployHA(t *testing.T) deployHA {
	t.Helper()
	var d deployHA
	var cm corev1.ConfigMap
	for name, obj := range map[string]any{"statefulset.yaml": &d.deploy, "pdb.yaml": &d.pdb, "config.yaml": &cm} {
		data, err := os.ReadFile(filepath.Join("..", "..", "deploy", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			t.Fatalf("deploy/%s: %v", name, err)
		}
	}
	cfg, err := config.Decode([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("deploy/config.yaml: %v", err)
	}
	d.cfg = cfg
	return d
}

// problems lists what keeps d from running highly available and stopping
// gracefully: three replicas at least (a bus that can lose a node),
// rolled one pod at a time, each replaced once its successor is ready and
// named through the bus's headless Service; a
// PodDisruptionBudget over the same pods that lets one go at a time;
// replicas spread across nodes; the probes on the metrics port; a
// readiness probe that notices a stopping replica within the gateway's
// drain delay; and a grace period that outlasts the drain.
func (d deployHA) problems() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	spec := d.deploy.Spec
	replicas := int32(1)
	if spec.Replicas != nil {
		replicas = *spec.Replicas
	}
	if replicas < 3 {
		add("statefulset.yaml: replicas %d; want at least 3 (the bus's JetStream cluster then survives the loss of a node)", replicas)
	}
	us := spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateStatefulSetStrategyType ||
		(us.RollingUpdate != nil && ((us.RollingUpdate.MaxUnavailable != nil && us.RollingUpdate.MaxUnavailable.IntValue() != 1) ||
			(us.RollingUpdate.Partition != nil && *us.RollingUpdate.Partition != 0))) {
		add("statefulset.yaml: updateStrategy %+v; a rolling update must replace one pod at a time, every pod", us)
	}
	if spec.ServiceName != "hubsync-bus" || spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		add("statefulset.yaml: serviceName %q, podManagementPolicy %q; want hubsync-bus (the routes' names) and Parallel (the nodes need each other to start)",
			spec.ServiceName, spec.PodManagementPolicy)
	}
	pods := labels.Set(spec.Template.Labels)
	if !selects(d.pdb.Spec.Selector, pods) {
		add("pdb.yaml: selector %v does not select the StatefulSet's pods %v", d.pdb.Spec.Selector, pods)
	}
	if allowed := disruptionsAllowed(d.pdb.Spec, replicas); allowed < 1 || allowed >= replicas {
		add("pdb.yaml: lets %d of %d pods go at once; want at least one and not all", allowed, replicas)
	}
	out = append(out, d.spreadProblems(pods)...)
	out = append(out, d.probeProblems()...)
	return out
}

// selects reports whether sel selects pods; a missing or empty selector
// selects nothing.
func selects(sel *metav1.LabelSelector, pods labels.Set) bool {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(pods)
}

// disruptionsAllowed is how many of replicas healthy pods the budget lets
// go at once.
func disruptionsAllowed(spec policyv1.PodDisruptionBudgetSpec, replicas int32) int32 {
	scaled := func(v *intstr.IntOrString) int32 {
		n, err := intstr.GetScaledValueFromIntOrPercent(v, int(replicas), true)
		if err != nil {
			return -1
		}
		return int32(n)
	}
	switch {
	case spec.MaxUnavailable != nil:
		return scaled(spec.MaxUnavailable)
	case spec.MinAvailable != nil:
		return replicas - scaled(spec.MinAvailable)
	}
	return -1
}

// spreadProblems: the pods are spread across nodes, as a preference (a
// hub with one node still runs every replica).
func (d deployHA) spreadProblems(pods labels.Set) []string {
	for _, c := range d.deploy.Spec.Template.Spec.TopologySpreadConstraints {
		if c.TopologyKey == corev1.LabelHostname && selects(c.LabelSelector, pods) && c.WhenUnsatisfiable == corev1.ScheduleAnyway {
			return nil
		}
	}
	return []string{"statefulset.yaml: no topologySpreadConstraint spreads the pods across " + corev1.LabelHostname + " (whenUnsatisfiable: ScheduleAnyway)"}
}

// probeProblems: liveness on /healthz and readiness on /readyz, on the
// container port that serves config.yaml's server.address; readiness fails
// within the drain delay, and the grace period outlasts the drain.
func (d deployHA) probeProblems() []string {
	var out []string
	pod := d.deploy.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return []string{fmt.Sprintf("statefulset.yaml: %d containers; want 1", len(pod.Containers))}
	}
	c := pod.Containers[0]
	_, port, _ := net.SplitHostPort(d.cfg.Server.Address)
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || !servesPort(c, p.probe.HTTPGet.Port, port) {
			out = append(out, fmt.Sprintf("statefulset.yaml: the %s probe must GET %s on the port of server.address %s", p.name, p.path, d.cfg.Server.Address))
		}
	}
	drain := d.cfg.Gateway.Drain
	if r := c.ReadinessProbe; r != nil {
		if notice := time.Duration(r.PeriodSeconds*max(r.FailureThreshold, 1)) * time.Second; notice > drain.DelayOrZero() {
			out = append(out, fmt.Sprintf("statefulset.yaml: the readiness probe notices a stopping replica after %s (periodSeconds x failureThreshold); "+
				"want at most gateway.drain.delay, %s, so that it leaves the endpoints while it still serves", notice, drain.DelayOrZero()))
		}
	}
	grace := time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if need := drain.DelayOrZero() + drain.Timeout.Duration + stopMargin; grace <= need {
		out = append(out, fmt.Sprintf("statefulset.yaml: terminationGracePeriodSeconds %s; want more than gateway.drain.delay + drain.timeout + %s = %s",
			grace, stopMargin, need))
	}
	return out
}

// servesPort reports whether p names (or numbers) the container port
// number want.
func servesPort(c corev1.Container, p intstr.IntOrString, want string) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return strconv.Itoa(int(cp.ContainerPort)) == want
		}
	}
	return false
}

// TestDeployHighlyAvailable checks deploy/ runs hubsync highly available
// and stops it gracefully (problems), and that each rule catches the
// manifest that breaks it.
func TestDeployHighlyAvailable(t *testing.T) {
	shipped := readDeployHA(t)
	if p := shipped.problems(); len(p) > 0 {
		t.Fatalf("deploy/:\n%s", strings.Join(p, "\n"))
	}
	one, seconds := int32(1), int64(25)
	tests := []struct {
		name string
		edit func(*deployHA)
		says string
	}{
		{"one replica", func(d *deployHA) { d.deploy.Spec.Replicas = &one }, "replicas 1"},
		{"pods replaced by hand", func(d *deployHA) {
			d.deploy.Spec.UpdateStrategy.Type = appsv1.OnDeleteStatefulSetStrategyType
		}, "one pod at a time"},
		{"two pods replaced at once", func(d *deployHA) {
			two := intstr.FromInt32(2)
			d.deploy.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{MaxUnavailable: &two}
		}, "one pod at a time"},
		{"pods started one by one", func(d *deployHA) {
			d.deploy.Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
		}, "Parallel"},
		{"a budget for other pods", func(d *deployHA) {
			d.pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "other"}}
		}, "does not select"},
		{"a budget that blocks every eviction", func(d *deployHA) {
			d.pdb.Spec.MaxUnavailable = &intstr.IntOrString{IntVal: 0}
		}, "lets 0 of 3"},
		{"no spread", func(d *deployHA) { d.deploy.Spec.Template.Spec.TopologySpreadConstraints = nil }, "topologySpreadConstraint"},
		{"readiness on the wrong path", func(d *deployHA) {
			d.deploy.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path = "/healthz"
		}, "readiness probe must GET /readyz"},
		{"liveness on the gateway's port", func(d *deployHA) {
			d.deploy.Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Port = intstr.FromString("gateway")
		}, "liveness probe must GET /healthz"},
		{"readiness slower than the drain delay", func(d *deployHA) {
			d.deploy.Spec.Template.Spec.Containers[0].ReadinessProbe.FailureThreshold = 3
		}, "notices a stopping replica after 6s"},
		{"a grace period the drain outlasts", func(d *deployHA) {
			d.deploy.Spec.Template.Spec.TerminationGracePeriodSeconds = &seconds
		}, "terminationGracePeriodSeconds 25s"},
		{"the default grace period", func(d *deployHA) {
			d.deploy.Spec.Template.Spec.TerminationGracePeriodSeconds = nil
		}, "terminationGracePeriodSeconds 30s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := readDeployHA(t)
			tt.edit(&d)
			p := strings.Join(d.problems(), "\n")
			if !strings.Contains(p, tt.says) {
				t.Fatalf("problems %q; want one saying %q", p, tt.says)
			}
		})
	}
}
