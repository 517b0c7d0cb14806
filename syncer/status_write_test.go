package syncer

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
