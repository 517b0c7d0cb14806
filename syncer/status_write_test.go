package syncer

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

func TestStatusBody(t *testing.T) {
	cond := metav1.Condition{Type: ConditionJoined, Status: metav1.ConditionTrue, Reason: "Joined", LastTransitionTime: metav1.Unix(1, 0)}
	tests := []struct {
		name        string
		status      cpv1alpha1.ClusterProfileStatus
		wantKeys    []string
		missingKeys []string
	}{
		{
			name:        "empty status leaves version and conditions out",
			status:      cpv1alpha1.ClusterProfileStatus{},
			missingKeys: []string{"version", "conditions", "properties", "accessProviders"},
		},
		{
			name:        "empty condition list left out",
			status:      cpv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{}, Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.35.4"}},
			wantKeys:    []string{"version"},
			missingKeys: []string{"conditions"},
		},
		{
			name:     "conditions and version written when known",
			status:   cpv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{cond}, Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.35.4"}},
			wantKeys: []string{"version", "conditions"},
		},
		{
			name:        "properties without version",
			status:      cpv1alpha1.ClusterProfileStatus{Properties: []cpv1alpha1.Property{{Name: "region", Value: "eu"}}},
			wantKeys:    []string{"properties"},
			missingKeys: []string{"version", "conditions"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &cpv1alpha1.ClusterProfile{
				ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", ResourceVersion: "7"},
				Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "c1", ClusterManager: cpv1alpha1.ClusterManager{Name: "open-cluster-management"}},
				Status:     tc.status,
			}
			body, err := StatusBody(p)
			if err != nil {
				t.Fatal(err)
			}
			var obj struct {
				Metadata map[string]any `json:"metadata"`
				Spec     map[string]any `json:"spec"`
				Status   map[string]any `json:"status"`
			}
			if err := json.Unmarshal(body, &obj); err != nil {
				t.Fatal(err)
			}
			if obj.Metadata["resourceVersion"] != "7" {
				t.Errorf("resourceVersion not kept: %s", body)
			}
			if obj.Spec["displayName"] != "c1" {
				t.Errorf("spec not kept: %s", body)
			}
			for _, k := range tc.wantKeys {
				if _, ok := obj.Status[k]; !ok {
					t.Errorf("status.%s missing: %s", k, body)
				}
			}
			for _, k := range tc.missingKeys {
				if _, ok := obj.Status[k]; ok {
					t.Errorf("status.%s present: %s", k, body)
				}
			}
			var round cpv1alpha1.ClusterProfile
			if err := json.Unmarshal(body, &round); err != nil {
				t.Fatal(err)
			}
			if len(round.Status.Conditions) != len(tc.status.Conditions) || round.Status.Version != tc.status.Version {
				t.Errorf("round trip changed the status: %+v", round.Status)
			}
		})
	}
}

// TestStatusBodyLeavesManagedFieldsOut: the status write after a create
// starts from the create's answer, which carries managedFields; the body
// leaves them out (the server keeps its own), and the object written from
// is not changed.
func TestStatusBodyLeavesManagedFieldsOut(t *testing.T) {
	fields := []metav1.ManagedFieldsEntry{{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}
	p := &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", ResourceVersion: "7", UID: "u1", ManagedFields: fields},
		Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "c1", ClusterManager: cpv1alpha1.ClusterManager{Name: "open-cluster-management"}},
		Status:     cpv1alpha1.ClusterProfileStatus{Version: cpv1alpha1.ClusterVersion{Kubernetes: "v1.35.4"}},
	}
	body, err := StatusBody(p)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Metadata map[string]any `json:"metadata"`
	}
	if err := json.Unmarshal(body, &obj); err != nil {
		t.Fatal(err)
	}
	if _, ok := obj.Metadata["managedFields"]; ok {
		t.Errorf("managedFields sent: %s", body)
	}
	if obj.Metadata["resourceVersion"] != "7" || obj.Metadata["uid"] != "u1" {
		t.Errorf("resourceVersion or uid not kept: %s", body)
	}
	if !reflect.DeepEqual(p.ManagedFields, fields) {
		t.Errorf("the profile's own managedFields changed: %v", p.ManagedFields)
	}
}

// TestStatusFieldsCoverUpstream keeps statusFields in step with the
// upstream status type: a field StatusBody did not know would be wiped by
// every status write, since the write replaces the whole status.
func TestStatusFieldsCoverUpstream(t *testing.T) {
	jsonNames := func(typ reflect.Type) map[string]reflect.Type {
		out := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			out[name] = ft
		}
		return out
	}
	upstream := jsonNames(reflect.TypeOf(cpv1alpha1.ClusterProfileStatus{}))
	ours := jsonNames(reflect.TypeOf(statusFields{}))
	if !reflect.DeepEqual(upstream, ours) {
		t.Errorf("statusFields %v differs from ClusterProfileStatus %v", ours, upstream)
	}
}

// TestStatusBodyKeepsEveryField fills every status field and checks that
// the body decodes to the same status.
func TestStatusBodyKeepsEveryField(t *testing.T) {
	p := &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "team-a", ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
		Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "c1", ClusterManager: cpv1alpha1.ClusterManager{Name: "open-cluster-management"}},
		Status: cpv1alpha1.ClusterProfileStatus{
			Conditions:          []metav1.Condition{{Type: ConditionJoined, Status: metav1.ConditionTrue, Reason: "Joined", LastTransitionTime: metav1.Unix(1, 0)}},
			Version:             cpv1alpha1.ClusterVersion{Kubernetes: "v1.35.4"},
			Properties:          []cpv1alpha1.Property{{Name: "region", Value: "eu"}},
			CredentialProviders: []cpv1alpha1.CredentialProvider{{Name: "token", Cluster: clientcmdCluster()}},
			AccessProviders:     []cpv1alpha1.AccessProvider{{Name: "open-cluster-management", Cluster: clientcmdCluster()}},
		},
	}
	body, err := StatusBody(p)
	if err != nil {
		t.Fatal(err)
	}
	var round cpv1alpha1.ClusterProfile
	if err := json.Unmarshal(body, &round); err != nil {
		t.Fatal(err)
	}
	if round.APIVersion != cpv1alpha1.GroupVersion.String() || round.Kind != "ClusterProfile" {
		t.Errorf("type meta %+v", round.TypeMeta)
	}
	if !equality.Semantic.DeepEqual(round.Status, p.Status) || !equality.Semantic.DeepEqual(round.ObjectMeta, p.ObjectMeta) || round.Spec != p.Spec {
		t.Errorf("round trip changed the profile:\n%s", body)
	}
}

func clientcmdCluster() clientcmdv1.Cluster {
	return clientcmdv1.Cluster{Server: "https://c1.example:6443", CertificateAuthorityData: []byte("ca")}
}
