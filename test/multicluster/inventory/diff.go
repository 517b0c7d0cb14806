package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
)

// Class says what an update of a profile changed for its readers, from
// least to most.
type Class int

const (
	// Invisible: nothing any consumer reads; bookkeeping only
	// (resourceVersion, generation, managedFields), a condition's
	// lastTransitionTime or observedGeneration without its status, an
	// access provider's extension re-encoded with the same meaning.
	Invisible Class = iota
	// ConsumerVisible: what consumers read but the provider neither
	// builds its config from nor checks for readiness (labels,
	// annotations, spec, version, properties, conditions' reason and
	// message, access providers the provider file does not pick).
	ConsumerVisible
	// ProviderRead: what BuildConfigFromCP reads of the picked access
	// provider other than server and CA (proxy-url, extensions), or the
	// status of ControlPlaneHealthy.
	ProviderRead
	// AccessConfig: the picked access provider, its server or its CA.
	AccessConfig
)

func (c Class) String() string {
	switch c {
	case Invisible:
		return "invisible"
	case ConsumerVisible:
		return "consumer-visible"
	case ProviderRead:
		return "provider-read"
	case AccessConfig:
		return "access-config"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Change is a profile update's class and the fields it changed, each
// as a path such as status.conditions[Joined].message.
type Change struct {
	Class  Class
	Fields []string
}

// changes accumulates fields with the class of each.
type changes struct{ c Change }

func (cs *changes) add(class Class, field string) {
	cs.c.Fields = append(cs.c.Fields, field)
	cs.c.Class = max(cs.c.Class, class)
}

// ClassifyUpdate compares two versions of a profile as the provider file
// conf sees them.
func ClassifyUpdate(conf *access.Config, before, after *cpv1alpha1.ClusterProfile) Change {
	var cs changes
	diffMeta(&cs, &before.ObjectMeta, &after.ObjectMeta)
	if !equality.Semantic.DeepEqual(before.Spec, after.Spec) {
		cs.add(ConsumerVisible, "spec")
	}
	b, a := &before.Status, &after.Status
	if b.Version != a.Version {
		cs.add(ConsumerVisible, "status.version")
	}
	if !equality.Semantic.DeepEqual(b.Properties, a.Properties) {
		cs.add(ConsumerVisible, "status.properties")
	}
	diffConditions(&cs, b.Conditions, a.Conditions)
	if !equality.Semantic.DeepEqual(b.CredentialProviders, a.CredentialProviders) {
		cs.add(ConsumerVisible, "status.credentialProviders")
	}
	diffProviders(&cs, conf, before, after)
	if len(cs.c.Fields) == 0 {
		cs.add(Invisible, "metadata.resourceVersion only")
	}
	sort.Strings(cs.c.Fields)
	return cs.c
}

func diffMeta(cs *changes, b, a *metav1.ObjectMeta) {
	for _, k := range changedKeys(b.Labels, a.Labels) {
		cs.add(ConsumerVisible, "metadata.labels["+k+"]")
	}
	for _, k := range changedKeys(b.Annotations, a.Annotations) {
		cs.add(ConsumerVisible, "metadata.annotations["+k+"]")
	}
	if !slices.Equal(b.Finalizers, a.Finalizers) {
		cs.add(ConsumerVisible, "metadata.finalizers")
	}
	if !equality.Semantic.DeepEqual(b.OwnerReferences, a.OwnerReferences) {
		cs.add(ConsumerVisible, "metadata.ownerReferences")
	}
	if !b.DeletionTimestamp.Equal(a.DeletionTimestamp) {
		cs.add(ConsumerVisible, "metadata.deletionTimestamp")
	}
	if b.Generation != a.Generation {
		cs.add(Invisible, "metadata.generation")
	}
	if !equality.Semantic.DeepEqual(b.ManagedFields, a.ManagedFields) {
		cs.add(Invisible, "metadata.managedFields")
	}
}

func changedKeys(b, a map[string]string) []string {
	keys := map[string]bool{}
	for k, v := range b {
		if w, ok := a[k]; !ok || w != v {
			keys[k] = true
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

func diffConditions(cs *changes, b, a []metav1.Condition) {
	byType := func(cs []metav1.Condition) map[string]metav1.Condition {
		m := make(map[string]metav1.Condition, len(cs))
		for _, c := range cs {
			m[c.Type] = c
		}
		return m
	}
	bm, am := byType(b), byType(a)
	for _, t := range changedTypes(bm, am) {
		bc, inB := bm[t]
		ac, inA := am[t]
		path := "status.conditions[" + t + "]"
		readiness := ConsumerVisible
		if t == cpv1alpha1.ClusterConditionControlPlaneHealthy {
			readiness = ProviderRead
		}
		switch {
		case !inB || !inA:
			cs.add(readiness, path)
			continue
		case bc.Status != ac.Status:
			cs.add(readiness, path+".status")
		}
		if bc.Reason != ac.Reason {
			cs.add(ConsumerVisible, path+".reason")
		}
		if bc.Message != ac.Message {
			cs.add(ConsumerVisible, path+".message")
		}
		if !bc.LastTransitionTime.Equal(&ac.LastTransitionTime) {
			cs.add(Invisible, path+".lastTransitionTime")
		}
		if bc.ObservedGeneration != ac.ObservedGeneration {
			cs.add(Invisible, path+".observedGeneration")
		}
	}
}

func changedTypes(b, a map[string]metav1.Condition) []string {
	var out []string
	for t, c := range b {
		if d, ok := a[t]; !ok || !equality.Semantic.DeepEqual(c, d) {
			out = append(out, t)
		}
	}
	for t := range a {
		if _, ok := b[t]; !ok {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// picked returns the name of the access provider the provider file picks
// in a profile, as BuildConfigFromCP does: the first of the file's
// providers that the profile lists.
func picked(conf *access.Config, p *cpv1alpha1.ClusterProfile) string {
	listed := map[string]bool{}
	for _, e := range p.Status.CredentialProviders {
		listed[e.Name] = true
	}
	for _, e := range p.Status.AccessProviders {
		listed[e.Name] = true
	}
	for _, prov := range conf.Providers {
		if listed[prov.Name] {
			return prov.Name
		}
	}
	return ""
}

func diffProviders(cs *changes, conf *access.Config, before, after *cpv1alpha1.ClusterProfile) {
	pb, pa := picked(conf, before), picked(conf, after)
	if pb != pa {
		cs.add(AccessConfig, fmt.Sprintf("status.accessProviders (picked %q, now %q)", pb, pa))
	}
	bm, am := providersByName(before), providersByName(after)
	names := map[string]bool{}
	for n := range bm {
		names[n] = true
	}
	for n := range am {
		names[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		path := "status.accessProviders[" + n + "]"
		bc, inB := bm[n]
		ac, inA := am[n]
		if inB && inA {
			diffCluster(cs, path, n == pa, bc, ac)
			continue
		}
		class := ConsumerVisible
		if n == pa || n == pb {
			class = AccessConfig
		}
		cs.add(class, path)
	}
}

func providersByName(p *cpv1alpha1.ClusterProfile) map[string]clientcmdv1.Cluster {
	m := map[string]clientcmdv1.Cluster{}
	for _, e := range p.Status.CredentialProviders {
		m[e.Name] = e.Cluster
	}
	for _, e := range p.Status.AccessProviders {
		m[e.Name] = e.Cluster
	}
	return m
}

func decoded(raw []byte) any {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	return v
}

// diffCluster compares two entries of one name; picked says whether the
// provider file picks it.
func diffCluster(cs *changes, path string, picked bool, b, a clientcmdv1.Cluster) {
	read := func(c Class) Class {
		if picked {
			return c
		}
		return ConsumerVisible
	}
	if b.Server != a.Server {
		cs.add(read(AccessConfig), path+".server")
	}
	if !bytes.Equal(b.CertificateAuthorityData, a.CertificateAuthorityData) {
		cs.add(read(AccessConfig), path+".certificate-authority-data")
	}
	if b.ProxyURL != a.ProxyURL {
		cs.add(read(ProviderRead), path+".proxy-url")
	}
	switch {
	case !reflect.DeepEqual(decodedExtensions(b), decodedExtensions(a)):
		cs.add(read(ProviderRead), path+".extensions")
	case !reflect.DeepEqual(b.Extensions, a.Extensions):
		cs.add(Invisible, path+".extensions (re-encoded, same meaning)")
	}
	rb, ra := b, a
	rb.Server, ra.Server, rb.CertificateAuthorityData, ra.CertificateAuthorityData = "", "", nil, nil
	rb.ProxyURL, ra.ProxyURL, rb.Extensions, ra.Extensions = "", "", nil, nil
	if !reflect.DeepEqual(rb, ra) {
		// BuildConfigFromCP reads none of the other fields.
		cs.add(ConsumerVisible, path+" (other fields)")
	}
}

func decodedExtensions(c clientcmdv1.Cluster) []any {
	out := make([]any, 0, len(c.Extensions))
	for _, e := range c.Extensions {
		out = append(out, []any{e.Name, decoded(e.Extension.Raw)})
	}
	return out
}
