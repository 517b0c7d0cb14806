package daemon

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

// TestLeaderEvents: the pool's Kubernetes Events are posted while the
// replica leads, and only then.
func TestLeaderEvents(t *testing.T) {
	for _, leading := range []bool{false, true} {
		rec := record.NewFakeRecorder(10)
		d := &daemon{recorder: rec}
		d.leading.Store(leading)
		ref := &corev1.ObjectReference{Kind: "ManagedCluster", Name: "c1"}
		ev := leaderEvents{d}
		ev.Event(ref, corev1.EventTypeNormal, "TunnelReady", "up")
		ev.Eventf(ref, corev1.EventTypeWarning, "TunnelFailing", "down: %s", "x")
		ev.AnnotatedEventf(ref, nil, corev1.EventTypeWarning, "TunnelFailing", "down: %s", "y")
		want := 0
		if leading {
			want = 3
		}
		if n := len(rec.Events); n != want {
			t.Errorf("leading %v: %d Events recorded, want %d", leading, n, want)
		}
	}
}
