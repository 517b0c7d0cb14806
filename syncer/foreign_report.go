package syncer

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// ReasonForeignWriter is the reason of the Warning Event that reports an
// object another controller writes too.
const ReasonForeignWriter = "ForeignWriter"

// foreignReporter acts on what foreignWriters decides for the writers of
// both controllers: it counts foreign writes, re-queues a held object for
// the end of its hold-off, and reports each hold-off once.
type foreignReporter struct {
	writers        *foreignWriters
	log            *slog.Logger
	recorder       record.EventRecorder
	total          *prometheus.CounterVec
	requestTimeout time.Duration
}

// ownedWrite is a write hubsync is about to make to an object it may have
// written before. The functions are called only when the object becomes
// contested.
type ownedWrite struct {
	kind, namespace, name string
	// rv is the resourceVersion the cache shows; intent sums up what
	// hubsync wants the object to say.
	rv     string
	intent uint64
	// requeue looks at the object again after a delay.
	requeue func(time.Duration)
	// subject is the object the Event is recorded on: the profile, the
	// copy's profile for a copy.
	subject runtime.Object
	// drift names what the object no longer says as hubsync wants.
	drift func() []string
	// managedFields reads the object's managedFields from the server (the
	// informers drop them).
	managedFields func(context.Context) ([]metav1.ManagedFieldsEntry, error)
}

// hold reports whether hubsync must leave the object alone now.
func (r *foreignReporter) hold(ctx context.Context, w ownedWrite) bool {
	v := r.writers.observe(w.kind, w.namespace, w.name, w.rv, w.intent)
	if v.counted {
		r.total.WithLabelValues(w.kind).Inc()
	}
	if v.report != nil {
		r.report(ctx, w, *v.report)
	}
	if v.recheck > 0 {
		w.requeue(v.recheck)
	}
	return v.hold
}

// report names the other writer from one read of the object's
// managedFields, and logs and records an Event that says what to turn off.
func (r *foreignReporter) report(ctx context.Context, w ownedWrite, c Contested) {
	drift := w.drift()
	ctx, cancel := context.WithTimeout(ctx, r.requestTimeout)
	defer cancel()
	writer := ""
	if mf, err := w.managedFields(ctx); err != nil {
		r.log.Warn("cannot read the managedFields of a contested object", "kind", w.kind, "namespace", w.namespace, "name", w.name, "err", err)
	} else {
		writer = writerOf(mf, drift)
	}
	controller, advice := writerAdvice(writer, w.kind)
	r.writers.named(w.kind, w.namespace, w.name, writer, controller)
	fields := strings.Join(drift, ", ")
	r.log.Warn("another controller writes what hubsync manages; hubsync leaves the object alone for a while",
		"kind", w.kind, "namespace", w.namespace, "name", w.name, "fields", fields, "writer", writer, "controller", controller,
		"writes", c.Writes, "holdOff", c.HoldOff, "advice", advice)
	if w.subject == nil {
		return
	}
	r.recorder.Eventf(w.subject, corev1.EventTypeWarning, ReasonForeignWriter,
		"%s %s/%s (%s) is also written by %s (field manager %q): %d writes undid hubsync's since %s; hubsync leaves it alone for %s, "+
			"then writes it again. To let hubsync alone write it, %s",
		describeKind(w.kind), w.namespace, w.name, fields, controller, writer, c.Writes, c.Since.UTC().Format(time.RFC3339),
		c.HoldOff, advice)
}

// contested returns the objects contested now, logging those that are no
// longer.
func (r *foreignReporter) contested() []Contested {
	for _, c := range r.writers.settle() {
		r.log.Info("no other controller wrote the object for a whole hold-off; it is no longer contested",
			"kind", c.Kind, "namespace", c.Namespace, "name", c.Name, "writer", c.Writer)
	}
	return r.writers.contested()
}

func describeKind(kind string) string {
	if kind == KindCredential {
		return "credential copy"
	}
	return "ClusterProfile"
}

// Contested returns the objects another controller writes too, sorted;
// /readyz?verbose reports them.
func (s *Syncer) Contested() []Contested { return s.foreign.contested() }
