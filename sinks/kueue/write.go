package kueue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
)

// obsMaxAge bounds how long a look at Kueue's objects is reused: a burst
// of deliveries costs one list every obsMaxAge, not one per batch. Errors
// and resyncs look afresh; an object created meanwhile under a name the
// sink writes is found by the create that fails.
const obsMaxAge = 30 * time.Second

// reconcile brings the objects of profiles to what the state says, and
// with prune deletes every object of the sink that no profile wants. It
// writes before it deletes, with the MultiKueueConfig in between, so the
// config never lists a MultiKueueCluster that does not exist yet or any
// more.
func (s *Sink) reconcile(ctx context.Context, profiles []string, prune bool) error {
	obs, err := s.obs.Get(ctx, s.now, s.observe)
	if err != nil {
		return err
	}
	wanted := func(p string) bool { _, ok := s.wanted(p); return ok }
	p := planReconcile(s.name, profiles, wanted, s.cfg.Source == config.KueueSourceSecret, obs, prune)
	for _, profile := range sortedKeys(p.conflicts) {
		s.setProblem(profile, conflict, p.conflicts[profile])
	}
	for _, profile := range p.settled {
		s.setProblem(profile, "", "")
	}
	if prune {
		s.health.forgetExcept(wanted)
	}
	var errs []error
	for _, profile := range p.write {
		if err := s.writeProfile(ctx, obs, profile); err != nil {
			errs = append(errs, fmt.Errorf("profile %s/%s: %w", s.cfg.Namespace, profile, err))
		}
	}
	errs = append(errs, s.syncConfig(ctx, obs, oursAfter(s.name, obs, p)))
	for _, name := range sortedKeys(p.deleteMKCs) {
		errs = append(errs, s.deleteMKC(ctx, obs, p.deleteMKCs[name]))
	}
	for _, name := range sortedKeys(p.deleteSecrets) {
		errs = append(errs, s.deleteSecret(ctx, obs, p.deleteSecrets[name]))
	}
	s.metrics.set(s.health.count(conflict), s.health.count(refused), len(oursAfter(s.name, obs, plan{})))
	return errors.Join(errs...)
}

// observe lists every MultiKueueCluster and the sink's Secrets, and gets
// the MultiKueueConfig.
func (s *Sink) observe(ctx context.Context) (*observed, error) {
	obs := &observed{mkcs: map[string]*unstructured.Unstructured{}, secrets: map[string]*corev1.Secret{}}
	mkcs, err := s.dyn.Resource(MultiKueueClusters).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list MultiKueueClusters (%s/%s; is Kueue installed?): %w", Group, Version, err)
	}
	for i := range mkcs.Items {
		obs.mkcs[mkcs.Items[i].GetName()] = &mkcs.Items[i]
	}
	secrets, err := s.kube.CoreV1().Secrets(s.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		hub.LabelManagedBy: hub.ManagedBy,
		hub.LabelSink:      s.name,
	}).String()})
	if err != nil {
		return nil, fmt.Errorf("list the Secrets of sink %s in %s: %w", s.name, s.cfg.Namespace, err)
	}
	for i := range secrets.Items {
		if sec := &secrets.Items[i]; owned(sec.Labels, s.name) {
			obs.secrets[sec.Name] = sec
		}
	}
	if s.cfg.MultiKueueConfig != "" {
		cur, err := s.dyn.Resource(MultiKueueConfigs).Get(ctx, s.cfg.MultiKueueConfig, metav1.GetOptions{})
		switch {
		case err == nil:
			obs.config = cur
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("get MultiKueueConfig %s: %w", s.cfg.MultiKueueConfig, err)
		}
	}
	return obs, nil
}

// writeProfile writes the kubeconfig Secret (source secret), then the
// MultiKueueCluster, of profile. A profile blocked by another's object or
// a kubeconfig Kueue would refuse is reported, not failed.
func (s *Sink) writeProfile(ctx context.Context, obs *observed, profile string) error {
	if s.cfg.Source == config.KueueSourceSecret {
		ok, err := s.writeSecret(ctx, obs, profile)
		if err != nil || !ok {
			return err
		}
	}
	ok, err := s.writeMKC(ctx, obs, profile)
	if err == nil && ok {
		s.setProblem(profile, "", "")
	}
	return err
}

// writeSecret brings profile's kubeconfig Secret up to date and reports
// whether the MultiKueueCluster may point at it.
func (s *Sink) writeSecret(ctx context.Context, obs *observed, profile string) (bool, error) {
	provider, _ := s.wanted(profile)
	tok, err := sinks.Token(ctx, s.kube, s.cfg.Namespace, profile, s.cfg.ManagedServiceAccount)
	switch {
	case errors.Is(err, sinks.ErrNoToken):
		// The copy went away after the change that announced it; its
		// removal will be delivered too.
		return false, nil
	case err != nil:
		return false, err
	}
	kc := kubeconfigFor(profile, s.cfg.ManagedServiceAccount, provider, tok)
	if err := sinks.CheckKueueKubeconfig(kc); err != nil {
		s.setProblem(profile, refused, fmt.Sprintf("the kubeconfig of profile %s is not written: %v", profile, err))
		return false, nil
	}
	data, err := sinks.EncodeKubeconfig(kc)
	if err != nil {
		return false, err
	}
	uid, ok, err := s.profileUID(ctx, profile)
	if err != nil || !ok {
		// Without the profile there is no owner: its deletion is coming.
		return false, err
	}
	want := desiredSecret(s.name, s.cfg, profile, uid, data, hub.TokenFingerprint([]byte(tok)))
	secrets := s.kube.CoreV1().Secrets(s.cfg.Namespace)
	cur := obs.secrets[want.Name]
	if cur == nil {
		created, err := secrets.Create(ctx, want, metav1.CreateOptions{FieldManager: hub.ManagedBy})
		switch {
		case err == nil:
			obs.secrets[want.Name] = created
			s.log.Info("created kubeconfig Secret", "profile", profile, "secret", want.Name)
			return true, nil
		case !apierrors.IsAlreadyExists(err):
			return false, fmt.Errorf("create Secret %s: %w", want.Name, err)
		}
		if cur, err = secrets.Get(ctx, want.Name, metav1.GetOptions{}); err != nil {
			return false, fmt.Errorf("get Secret %s: %w", want.Name, err)
		}
		if !owned(cur.Labels, s.name) {
			s.setProblem(profile, conflict, fmt.Sprintf("Secret %s/%s exists and hubsync did not create it; it is left alone, and MultiKueueCluster %s is not written",
				s.cfg.Namespace, want.Name, profile))
			return false, nil
		}
	}
	if secretUpToDate(cur, want) {
		return true, nil
	}
	out, err := secrets.Update(ctx, secretUpdated(cur, want), metav1.UpdateOptions{FieldManager: hub.ManagedBy})
	if err != nil {
		return false, fmt.Errorf("update Secret %s: %w", want.Name, err)
	}
	obs.secrets[want.Name] = out
	s.log.Info("updated kubeconfig Secret", "profile", profile, "secret", want.Name, "tokenFingerprint", want.Annotations[hub.AnnotationTokenFingerprint])
	return true, nil
}

// profileUID returns the UID of profile in Kueue's namespace, listing the
// namespace's profiles when it is not known; ok is false when the profile
// does not exist.
func (s *Sink) profileUID(ctx context.Context, profile string) (types.UID, bool, error) {
	if uid, ok := s.uids[profile]; ok {
		return uid, true, nil
	}
	l, err := s.dyn.Resource(clusterProfiles).Namespace(s.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", false, fmt.Errorf("list the ClusterProfiles of %s: %w", s.cfg.Namespace, err)
	}
	for _, p := range l.Items {
		s.uids[p.GetName()] = p.GetUID()
	}
	uid, ok := s.uids[profile]
	return uid, ok, nil
}

// writeMKC brings profile's MultiKueueCluster up to date and reports
// whether it is the sink's.
func (s *Sink) writeMKC(ctx context.Context, obs *observed, profile string) (bool, error) {
	want := desiredMKC(s.name, s.cfg, profile)
	client := s.dyn.Resource(MultiKueueClusters)
	cur := obs.mkcs[profile]
	if cur == nil {
		created, err := client.Create(ctx, want, metav1.CreateOptions{FieldManager: hub.ManagedBy})
		switch {
		case err == nil:
			obs.mkcs[profile] = created
			s.log.Info("created MultiKueueCluster", "profile", profile)
			return true, nil
		case !apierrors.IsAlreadyExists(err):
			return false, fmt.Errorf("create MultiKueueCluster %s: %w", profile, err)
		}
		if cur, err = client.Get(ctx, profile, metav1.GetOptions{}); err != nil {
			return false, fmt.Errorf("get MultiKueueCluster %s: %w", profile, err)
		}
		obs.mkcs[profile] = cur
		if !owned(cur.GetLabels(), s.name) {
			s.setProblem(profile, conflict, fmt.Sprintf("MultiKueueCluster %s exists and hubsync did not create it; it is left alone", profile))
			return false, nil
		}
	}
	if mkcUpToDate(cur, want) {
		return true, nil
	}
	out, err := client.Update(ctx, mkcUpdated(cur, want), metav1.UpdateOptions{FieldManager: hub.ManagedBy})
	if err != nil {
		return false, fmt.Errorf("update MultiKueueCluster %s: %w", profile, err)
	}
	obs.mkcs[profile] = out
	s.log.Info("updated MultiKueueCluster", "profile", profile)
	return true, nil
}

// deleteMKC deletes one of the sink's MultiKueueClusters, provided it is
// still the object the sink saw.
func (s *Sink) deleteMKC(ctx context.Context, obs *observed, m *unstructured.Unstructured) error {
	uid := m.GetUID()
	err := s.dyn.Resource(MultiKueueClusters).Delete(ctx, m.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MultiKueueCluster %s: %w", m.GetName(), err)
	}
	delete(obs.mkcs, m.GetName())
	if err == nil {
		s.log.Info("deleted MultiKueueCluster", "profile", m.GetName())
	}
	return nil
}

// deleteSecret deletes one of the sink's kubeconfig Secrets, provided it
// is still the object the sink saw.
func (s *Sink) deleteSecret(ctx context.Context, obs *observed, sec *corev1.Secret) error {
	err := s.kube.CoreV1().Secrets(sec.Namespace).Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	delete(obs.secrets, sec.Name)
	if err == nil {
		s.log.Info("deleted kubeconfig Secret", "secret", sec.Name)
	}
	return nil
}

// syncConfig keeps the configured MultiKueueConfig listing ours, the
// sink's MultiKueueClusters: created when missing, deleted when ours is
// empty (the config must list at least one cluster), left alone when it is
// not the sink's.
func (s *Sink) syncConfig(ctx context.Context, obs *observed, ours []string) error {
	name := s.cfg.MultiKueueConfig
	if name == "" {
		return nil
	}
	cur := obs.config
	if cur != nil && !owned(cur.GetLabels(), s.name) {
		s.setProblem(configKey, conflict, fmt.Sprintf("MultiKueueConfig %s exists and hubsync did not create it; it is left alone", name))
		return nil
	}
	var current []string
	if cur != nil {
		current = specClusters(cur)
	}
	clusters, leftOut := configClusters(current, ours)
	if len(leftOut) > 0 {
		s.setProblem(configKey, tooMany, fmt.Sprintf("MultiKueueConfig %s lists at most %d clusters; left out: %v", name, config.KueueMaxClusters, leftOut))
	} else {
		s.setProblem(configKey, "", "")
	}
	client := s.dyn.Resource(MultiKueueConfigs)
	switch {
	case len(clusters) == 0 && cur == nil:
		return nil
	case len(clusters) == 0:
		uid := cur.GetUID()
		err := client.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete MultiKueueConfig %s: %w", name, err)
		}
		obs.config = nil
		s.log.Info("deleted MultiKueueConfig: no cluster left to list", "multiKueueConfig", name)
		return nil
	case cur != nil && slices.Equal(current, clusters) && maps.Equal(cur.GetLabels(), ownLabels(s.name, s.cfg.Labels, "")):
		return nil
	}
	return s.writeConfig(ctx, obs, cur, clusters)
}

// writeConfig creates or updates the MultiKueueConfig with clusters.
func (s *Sink) writeConfig(ctx context.Context, obs *observed, cur *unstructured.Unstructured, clusters []string) error {
	name := s.cfg.MultiKueueConfig
	client := s.dyn.Resource(MultiKueueConfigs)
	want := desiredConfig(s.name, s.cfg, cur, clusters)
	var out *unstructured.Unstructured
	var err error
	if cur == nil {
		out, err = client.Create(ctx, want, metav1.CreateOptions{FieldManager: hub.ManagedBy})
		if apierrors.IsAlreadyExists(err) {
			// Created meanwhile: looked at again by the retry.
			return fmt.Errorf("create MultiKueueConfig %s: %w", name, err)
		}
	} else {
		out, err = client.Update(ctx, want, metav1.UpdateOptions{FieldManager: hub.ManagedBy})
	}
	if err != nil {
		return fmt.Errorf("write MultiKueueConfig %s: %w", name, err)
	}
	obs.config = out
	s.log.Info("wrote MultiKueueConfig", "multiKueueConfig", name, "clusters", clusters)
	return nil
}

// setProblem records the problem of profile (or configKey: the
// MultiKueueConfig), kind "" for none, logging it when it starts or
// changes and when it ends.
func (s *Sink) setProblem(profile, kind, reason string) {
	if !s.health.set(profile, kind, reason, s.now()) {
		return
	}
	about := []any{"profile", profile}
	if profile == configKey {
		about = []any{"multiKueueConfig", s.cfg.MultiKueueConfig}
	}
	if kind == "" {
		s.log.Info("kueue sink: problem resolved", about...)
		return
	}
	s.log.Warn("kueue sink: "+reason, append(about, "problem", kind)...)
}

// recordAttempt records a delivery's or resync's outcome for Report.
func (s *Sink) recordAttempt(err error) { s.health.attempt(err, s.now()) }
