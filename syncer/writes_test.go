package syncer

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestWriteTrackerSawDeleted: an object hubsync wrote and someone else
// deleted (the garbage collector, a tool) is not a write still on its way
// once the cache has seen the deletion, whether or not a reconcile saw the
// write first. Without that, the deleted copy was never written again
// until the next resync.
func TestWriteTrackerSawDeleted(t *testing.T) {
	secret := func(rv string, uid types.UID) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-msa", ResourceVersion: rv, UID: uid}}
	}
	const key = "ns/c-msa"
	type step struct {
		wrote, deletedByUs, sawDeleted *corev1.Secret
		echo                           *corev1.Secret // an add or update event: want wantEcho
		wantEcho                       bool
		pending                        bool // otherwise: ask whether an absent object is pending
		want                           bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "created, echo seen, deleted by someone else", steps: []step{
			{wrote: secret("10", "u1")},
			{echo: secret("10", "u1"), wantEcho: true},
			{pending: true, want: true}, // the cache cannot tell yet
			{sawDeleted: secret("11", "u1")},
			{pending: true, want: false},
		}},
		{name: "created and deleted before the cache saw either", steps: []step{
			{wrote: secret("10", "u1")},
			{sawDeleted: secret("11", "u1")},
			{pending: true, want: false},
		}},
		{name: "updated, then deleted by someone else", steps: []step{
			{wrote: secret("12", "u1")},
			{sawDeleted: secret("13", "u1")},
			{pending: true, want: false},
		}},
		{name: "the deletion of an older object leaves a newer write pending", steps: []step{
			{wrote: secret("20", "u2")},
			{sawDeleted: secret("11", "u1")},
			{pending: true, want: true},
		}},
		{name: "hubsync's own delete, seen", steps: []step{
			{deletedByUs: secret("10", "u1")},
			{sawDeleted: secret("10", "u1")},
			{pending: true, want: false},
		}},
		{name: "a deletion is never an echo", steps: []step{
			{deletedByUs: secret("10", "u1")},
			{echo: secret("10", "u1"), wantEcho: false},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWriteTracker(time.Minute)
			for i, s := range tc.steps {
				switch {
				case s.wrote != nil:
					w.wrote(s.wrote)
				case s.deletedByUs != nil:
					w.deletedObj(s.deletedByUs)
				case s.sawDeleted != nil:
					w.sawDeleted(s.sawDeleted)
				case s.echo != nil:
					if got := w.isEcho(s.echo); got != s.wantEcho {
						t.Errorf("step %d: isEcho = %v, want %v", i, got, s.wantEcho)
					}
				case s.pending:
					if got := pendingFor(w, key, (*corev1.Secret)(nil)); got != s.want {
						t.Errorf("step %d: pending = %v, want %v", i, got, s.want)
					}
				}
			}
		})
	}
}

// TestObserveClosesTheEchoWindow: the informer updates its cache and then
// calls the event handler; a reconcile that read the cache just before the
// update must not lose the echo that its own skip depends on. observe reads
// and judges in one step, so the handler's isEcho comes after the skip was
// recorded and re-queues the key.
func TestObserveClosesTheEchoWindow(t *testing.T) {
	w := newWriteTracker(time.Minute)
	written := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-msa", ResourceVersion: "10", UID: "u1"}}
	w.wrote(written)
	echo := make(chan bool)
	cur, pending := observe(w, "ns/c-msa", func() *corev1.Secret {
		// The cache is updated right after this read, and its handler
		// runs at once.
		go func() { echo <- w.isEcho(written) }()
		return nil
	})
	if cur != nil || !pending {
		t.Fatalf("observe = %v, %v; want nothing, pending", cur, pending)
	}
	if <-echo {
		t.Fatal("the write's event was taken for a mere echo after the reconcile skipped for it: the skipped work waits for the next resync")
	}
}
