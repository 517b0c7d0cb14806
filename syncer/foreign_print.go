package syncer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"reflect"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/hub"
)

// printer sums up what hubsync wants an object to say. Prints are compared
// only within one process, so the seed may be random.
type printer struct{ h maphash.Hash }

func newPrinter(seed maphash.Seed) *printer {
	p := &printer{}
	p.h.SetSeed(seed)
	return p
}

// str writes s and a separator, so that ("ab", "c") and ("a", "bc") differ.
func (p *printer) str(ss ...string) {
	for _, s := range ss {
		_, _ = p.h.WriteString(s)
		_ = p.h.WriteByte(0)
	}
}

func (p *printer) bytes(b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	_, _ = p.h.Write(n[:])
	_, _ = p.h.Write(b)
}

// profileLabelKeys are the labels hubsync owns on a profile.
var profileLabelKeys = [...]string{hub.LabelClusterManager, hub.LabelClusterName, hub.LabelProfileSet}

// ownConditions are the condition types hubsync owns on a profile.
var ownConditions = [...]string{ConditionControlPlaneHealthy, ConditionJoined}

// profilePrint sums up what hubsync owns of a profile it is about to
// write: its labels and spec (p) and status (st), only its own conditions
// and access providers.
func (f *foreignWriters) profilePrint(p *cpv1alpha1.ClusterProfile, st *cpv1alpha1.ClusterProfileStatus, providers []Provider) uint64 {
	pr := newPrinter(f.seed)
	for _, k := range profileLabelKeys {
		pr.str(k, p.Labels[k])
	}
	pr.str(p.Spec.DisplayName, p.Spec.ClusterManager.Name, st.Version.Kubernetes)
	for _, prop := range st.Properties {
		pr.str(prop.Name, prop.Value)
	}
	// Not lastTransitionTime: hubsync keeps whatever time the profile has
	// while the status stays the same, so it is not part of what hubsync
	// insists on.
	for _, t := range ownConditions {
		if c := meta.FindStatusCondition(st.Conditions, t); c != nil {
			pr.str(c.Type, string(c.Status), c.Reason, c.Message)
		}
	}
	for _, prov := range providers {
		e := findProvider(st.AccessProviders, prov.Name)
		if e == nil {
			pr.str(prov.Name, "-")
			continue
		}
		pr.str(e.Name, e.Cluster.Server)
		pr.bytes(e.Cluster.CertificateAuthorityData)
		for _, x := range e.Cluster.Extensions {
			pr.str(x.Name)
			pr.bytes(x.Extension.Raw)
		}
	}
	return pr.h.Sum64()
}

// copyPrint sums up what hubsync owns of a credential copy it is about to
// write: type, data, the synced-from label, its annotations and the
// controller reference.
func (f *foreignWriters) copyPrint(sec *corev1.Secret) uint64 {
	pr := newPrinter(f.seed)
	pr.str(string(sec.Type), sec.Labels[hub.LabelSyncedFrom])
	for _, k := range copyAnnotationKeys {
		pr.str(k, sec.Annotations[k])
	}
	pr.str(strconv.Itoa(len(sec.Data)))
	for _, k := range [...]string{hub.TokenKey, hub.CAKey} {
		pr.str(k)
		pr.bytes(sec.Data[k])
	}
	if ref := metav1.GetControllerOf(sec); ref != nil {
		pr.str(ref.APIVersion, ref.Kind, ref.Name, string(ref.UID))
	}
	return pr.h.Sum64()
}

var copyAnnotationKeys = [...]string{hub.AnnotationSource, hub.AnnotationTokenFingerprint, hub.AnnotationTokenExpiration}

func findProvider(list []cpv1alpha1.AccessProvider, name string) *cpv1alpha1.AccessProvider {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

// profileDrift names the parts of what hubsync owns of a profile that cur
// no longer says as want and st do, for reports.
func profileDrift(cur, want *cpv1alpha1.ClusterProfile, st *cpv1alpha1.ClusterProfileStatus, providers []Provider) []string {
	var out []string
	for _, k := range profileLabelKeys {
		if cur.Labels[k] != want.Labels[k] {
			out = append(out, "labels")
			break
		}
	}
	if cur.Spec.DisplayName != want.Spec.DisplayName {
		out = append(out, "spec")
	}
	for _, p := range providers {
		a, b := findProvider(cur.Status.AccessProviders, p.Name), findProvider(st.AccessProviders, p.Name)
		if (a == nil) != (b == nil) || (a != nil && !sameProvider(*a, *b)) {
			out = append(out, "status.accessProviders["+p.Name+"]")
		}
	}
	rest := func(s *cpv1alpha1.ClusterProfileStatus) []any {
		var conds []*metav1.Condition
		for _, t := range ownConditions {
			conds = append(conds, meta.FindStatusCondition(s.Conditions, t))
		}
		return []any{s.Version, s.Properties, conds}
	}
	if !equality.Semantic.DeepEqual(rest(&cur.Status), rest(st)) {
		out = append(out, "status")
	}
	return out
}

// copyDrift names the parts of what hubsync owns of a copy that cur no
// longer says as want does, for reports.
func copyDrift(cur, want *corev1.Secret) []string {
	var out []string
	if cur.Type != want.Type {
		out = append(out, "type")
	}
	if !sameData(cur.Data, want.Data) {
		out = append(out, "data")
	}
	if cur.Labels[hub.LabelSyncedFrom] != want.Labels[hub.LabelSyncedFrom] {
		out = append(out, "labels")
	}
	for _, k := range copyAnnotationKeys {
		if cur.Annotations[k] != want.Annotations[k] {
			out = append(out, "annotations")
			break
		}
	}
	if !reflect.DeepEqual(metav1.GetControllerOf(cur), metav1.GetControllerOf(want)) {
		out = append(out, "ownerReferences")
	}
	return out
}

// writerOf returns the field manager, other than hubsync's own, that owns
// the fields drift names (the most recent such entry), else the most
// recent other manager at all; "" when there is none.
func writerOf(entries []metav1.ManagedFieldsEntry, drift []string) string {
	var markers [][]byte
	for _, d := range drift {
		field, _, _ := strings.Cut(d, "[")
		field = field[strings.LastIndex(field, ".")+1:]
		markers = append(markers, []byte(`"f:`+field+`"`))
	}
	best, bestMatch := -1, false
	for i, e := range entries {
		if e.Manager == FieldManager || e.Manager == "" {
			continue
		}
		match := false
		for _, m := range markers {
			if e.FieldsV1 != nil && bytes.Contains(e.FieldsV1.Raw, m) {
				match = true
			}
		}
		if best < 0 || (match && !bestMatch) || (match == bestMatch && later(e.Time, entries[best].Time)) {
			best, bestMatch = i, match
		}
	}
	if best < 0 {
		return ""
	}
	return entries[best].Manager
}

func later(a, b *metav1.Time) bool {
	return a != nil && (b == nil || a.After(b.Time))
}

// writerAdvice names the controller behind a field manager, and says what
// to turn off, for the kind of object it writes. Upstream controllers set
// no field manager of their own, so the API server names them after their
// binary: cluster-proxy's addon manager is "manager", managed-serviceaccount's
// "msa", OCM's hub "registration".
func writerAdvice(writer, kind string) (controller, advice string) {
	switch {
	case writer == "cluster-proxy" || (writer == "manager" && kind == KindProfile):
		return "cluster-proxy", "turn off cluster-proxy's ClusterProfile access provider: feature gate ClusterProfileAccessProvider " +
			"(Helm value featureGates.clusterProfileAccessProvider) up to v0.10, clusterProfile from v0.11"
	case writer == "managed-serviceaccount" || writer == "msa":
		return "managed-serviceaccount", "turn off managed-serviceaccount's ClusterProfile credential syncer: feature gate ClusterProfileCredSyncer " +
			"(Helm value featureGates.clusterProfileCredSyncer) up to v0.10, ClusterProfile in later releases"
	case writer == "registration" || writer == "registration-controller":
		return "OCM registration", "turn off OCM registration's ClusterProfile controller: feature gate ClusterProfile of the hub " +
			"(ClusterManager spec.registrationConfiguration.featureGates: {feature: ClusterProfile, mode: Disable})"
	case writer == "":
		return "unknown", "no field manager but hubsync's own owns these fields: another hubsync with a different configuration " +
			"and the same cluster manager name is the likely writer; run one"
	default:
		return writer, fmt.Sprintf("stop the controller that writes as field manager %q from writing this object, or stop hubsync writing it", writer)
	}
}
