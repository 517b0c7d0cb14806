package syncer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// apply writes one pair's plan: deletes, then creates (not where a delete
// failed: the old copy still holds the name), then updates. Errors are
// joined so that one namespace never stops the others; the pair is then
// retried.
func (c *credentials) apply(ctx context.Context, pair Pair, msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret, plan CopyPlan) error {
	key := hub.SourceKey(pair.Cluster, pair.MSA)
	if plan.Source == PlanHold {
		c.setProblem(key, msa, plan.Problem)
		if plan.Problem == ProblemNone {
			c.log.Debug("ManagedServiceAccount has not reported its token Secret yet", "pair", key)
		}
		return nil
	}
	var errs []error
	failed := sets.New[string]()
	for _, d := range plan.Delete {
		if err := c.deleteCopy(ctx, d.Secret, d.Why); err != nil {
			errs = append(errs, err)
			failed.Insert(d.Secret.Namespace)
		}
	}
	conflict := len(plan.Conflicts) > 0
	for _, want := range plan.Create {
		if failed.Has(want.Namespace) {
			continue
		}
		switch err := c.create(ctx, pair, want); {
		case errors.Is(err, errForeignSecret):
			conflict = true
		case err != nil:
			errs = append(errs, err)
		}
	}
	rotated := sets.New[string]()
	for _, u := range plan.Update {
		intent := c.foreign.writers.copyPrint(u.Secret)
		if c.holdCopy(ctx, pair, u.Secret, intent) {
			continue
		}
		if err := c.update(ctx, u, intent); err != nil {
			errs = append(errs, err)
		} else if u.Rotated {
			rotated.Insert(u.Secret.Namespace)
		}
	}
	problem := plan.Problem
	if conflict && problem == ProblemNone {
		problem = ProblemNameConflict
	}
	c.setProblem(key, msa, problem)
	if rotated.Len() > 0 {
		c.reportRotation(msa, hubSecret, rotated)
	}
	return errors.Join(errs...)
}

var errForeignSecret = errors.New("a Secret that hubsync does not own has the copy's name")

// create writes a new copy. A Secret with the copy's name that the cache
// does not show is either not seen yet or not a copy at all (no synced-from
// label): it is looked at before deciding.
func (c *credentials) create(ctx context.Context, pair Pair, want *corev1.Secret) error {
	err := c.write(ctx, "create", func(ctx context.Context) error {
		out, err := c.kube.CoreV1().Secrets(want.Namespace).Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
		if err == nil {
			c.written.wrote(out)
			c.foreign.writers.wrote(KindCredential, out.Namespace, out.Name, out.ResourceVersion, c.foreign.writers.copyPrint(want))
			c.notify(stream.CredentialSynced, out)
			c.log.Debug("credential copy created", "namespace", out.Namespace, "secret", out.Name, "source", hub.SourceKey(pair.Cluster, pair.MSA))
		}
		return err
	})
	switch {
	case err == nil, isNamespaceGone(err):
		return nil
	case apierrors.IsAlreadyExists(err):
		cur, gerr := c.kube.CoreV1().Secrets(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		if gerr == nil && copyOwnership(cur, pair.Cluster, pair.MSA, c.liveProfile(want.Namespace, pair.Cluster), pair.Manager) == foreign {
			return errForeignSecret
		}
		return fmt.Errorf("create credential copy %s/%s: %w", want.Namespace, want.Name, err)
	default:
		return fmt.Errorf("create credential copy %s/%s: %w", want.Namespace, want.Name, err)
	}
}

// update replaces a copy, guarded by the resourceVersion it was planned on;
// intent sums up what hubsync wants it to say.
func (c *credentials) update(ctx context.Context, u CopyUpdate, intent uint64) error {
	typ := stream.CredentialSynced
	if u.Rotated {
		typ = stream.CredentialRotated
	}
	err := c.write(ctx, "update", func(ctx context.Context) error {
		out, err := c.kube.CoreV1().Secrets(u.Secret.Namespace).Update(ctx, u.Secret, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			c.written.wrote(out)
			c.foreign.writers.wrote(KindCredential, out.Namespace, out.Name, out.ResourceVersion, intent)
			c.notify(typ, out)
			c.log.Debug("credential copy updated", "namespace", out.Namespace, "secret", out.Name, "rotated", u.Rotated)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("update credential copy %s/%s: %w", u.Secret.Namespace, u.Secret.Name, err)
	}
	return nil
}

// holdCopy reports whether hubsync must leave a copy alone now, because
// another controller keeps writing what hubsync wants it to say (want).
// The Event goes to the copy's profile, where consumers look.
func (c *credentials) holdCopy(ctx context.Context, pair Pair, want *corev1.Secret, intent uint64) bool {
	w := ownedWrite{
		kind: KindCredential, namespace: want.Namespace, name: want.Name, rv: want.ResourceVersion, intent: intent,
		requeue: func(d time.Duration) { c.queue.AddAfter(hub.SourceKey(pair.Cluster, pair.MSA), d) },
		drift: func() []string {
			cur, err := c.copies.Secrets(want.Namespace).Get(want.Name)
			if err != nil {
				return nil
			}
			return copyDrift(cur, want)
		},
		managedFields: func(ctx context.Context) ([]metav1.ManagedFieldsEntry, error) {
			return secretManagedFields(ctx, c.kube, want.Namespace, want.Name)
		},
	}
	if p := c.liveProfile(want.Namespace, pair.Cluster); p != nil {
		w.subject = p
	}
	return c.foreign.hold(ctx, w)
}

// secretManagedFields reads a Secret's managedFields. It asks for the
// metadata alone, so that reading who else writes a copy does not fetch
// the token again.
func secretManagedFields(ctx context.Context, kube kubernetes.Interface, namespace, name string) ([]metav1.ManagedFieldsEntry, error) {
	rc, ok := kube.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		// A fake clientset has no REST client.
		sec, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return sec.ManagedFields, nil
	}
	raw, err := rc.Get().Namespace(namespace).Resource("secrets").Name(name).
		SetHeader("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1").
		DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var m metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode the metadata of Secret %s/%s: %w", namespace, name, err)
	}
	return m.ManagedFields, nil
}

// liveProfile returns the cached profile named after the cluster in ns, of
// any cluster manager.
func (c *credentials) liveProfile(ns, cluster string) *cpv1alpha1.ClusterProfile {
	obj, ok, err := c.profiles.Informer().GetIndexer().GetByKey(ns + "/" + cluster)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*cpv1alpha1.ClusterProfile)
	return p
}

// deleteCopy deletes one copy, guarded by its uid.
func (c *credentials) deleteCopy(ctx context.Context, sec *corev1.Secret, why string) error {
	uid := sec.UID
	err := c.write(ctx, "delete", func(ctx context.Context) error {
		return c.kube.CoreV1().Secrets(sec.Namespace).Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete credential copy %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	c.written.deletedObj(sec)
	c.foreign.writers.forget(KindCredential, sec.Namespace, sec.Name)
	if err == nil {
		c.notify(stream.CredentialRemoved, sec)
	}
	pair, _ := copyPair(sec)
	c.log.Info("credential copy removed", "namespace", sec.Namespace, "secret", sec.Name, "source", pair, "reason", why,
		"madeBy", map[bool]string{true: "hubsync", false: "the upstream syncer"}[sec.Annotations[hub.AnnotationSource] != ""])
	return nil
}

func (c *credentials) write(ctx context.Context, op string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	err := f(ctx)
	c.writes.WithLabelValues(op).Inc()
	if err != nil {
		c.metrics.writeErrors.WithLabelValues("credential-" + op).Inc()
	}
	return err
}

// reportRotation logs and records one event per rotation of a pair, naming
// the new token's fingerprint and expiry, never the token.
func (c *credentials) reportRotation(msa *msav1beta1.ManagedServiceAccount, hubSecret *corev1.Secret, namespaces sets.Set[string]) {
	c.rotations.Inc()
	fp := hub.TokenFingerprint(hubSecret.Data[hub.TokenKey])
	expiry := "unknown"
	if exp, ok := TokenExpiry(msa, hubSecret.Data[hub.TokenKey]); ok {
		expiry = exp.Format(time.RFC3339)
	}
	c.log.Info("credential rotated", "cluster", msa.Namespace, "managedServiceAccount", msa.Name,
		"fingerprint", fp, "expires", expiry, "copies", namespaces.Len(), "namespaces", strings.Join(sets.List(namespaces), ","))
	c.recorder.Eventf(msa, corev1.EventTypeNormal, "CredentialRotated",
		"token %s (expires %s) copied to %d namespace(s): %s", fp, expiry, namespaces.Len(), strings.Join(sets.List(namespaces), ", "))
}

// setProblem records a pair's problem, reporting it (log, Event on the
// MSA) only when it changes, and keeps the gauge current.
func (c *credentials) setProblem(key string, msa *msav1beta1.ManagedServiceAccount, p CopyProblem) {
	c.mu.Lock()
	prev := c.problems[key]
	if p == ProblemNone {
		delete(c.problems, key)
	} else {
		c.problems[key] = p
	}
	if p != prev {
		if prev != ProblemNone {
			c.problemsG.WithLabelValues(prev.MetricReason()).Dec()
		}
		if p != ProblemNone {
			c.problemsG.WithLabelValues(p.MetricReason()).Inc()
		}
	}
	c.mu.Unlock()
	switch {
	case p == prev:
	case p == ProblemNone:
		c.log.Info("credential problem resolved", "pair", key, "was", string(prev))
	case p == ProblemImpersonator:
		c.log.Warn("refusing to copy the gateway's impersonating credential", "pair", key, "reason", p.MetricReason(), "problem", string(p))
		if msa != nil {
			c.recorder.Eventf(msa, corev1.EventTypeWarning, p.EventReason(), "hubsync does not copy this token: %s", string(p))
		}
	default:
		c.log.Warn("credential copies cannot be written", "pair", key, "reason", p.MetricReason(), "problem", string(p))
		if msa != nil {
			c.recorder.Eventf(msa, corev1.EventTypeWarning, p.EventReason(), "hubsync cannot copy this token: %s", string(p))
		}
	}
}
