package syncer

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// statusEmpty reports whether a status has nothing to say: no version,
// conditions, properties or providers.
func statusEmpty(st cpv1alpha1.ClusterProfileStatus) bool {
	return equality.Semantic.DeepEqual(st, cpv1alpha1.ClusterProfileStatus{})
}

// StatusBody is the JSON hubsync sends to a profile's status subresource.
// The typed object always serialises status.version (a struct) as {} and
// status.conditions as null; OCM's own controller leaves both out for a
// cluster that reports no version and no conditions, and so does hubsync.
// It is encoded in one pass through statusDocument, whose status mirrors
// every field of the upstream type (a test keeps the two in step), rather
// than through a generic map, which cost as much CPU as the write's own
// encoding.
//
// The body carries no managedFields: the server then keeps the object's
// own and records the write under FieldManager, as it does for any request
// without them. A profile just created, written from the create's answer,
// would otherwise send them back for the server to decode and compare,
// about a third of the body, on every new profile of a burst.
func StatusBody(p *cpv1alpha1.ClusterProfile) ([]byte, error) {
	st := &p.Status
	meta := p.ObjectMeta
	meta.ManagedFields = nil
	doc := statusDocument{
		// Objects from a typed client carry no TypeMeta; the server needs it.
		TypeMeta:   metav1.TypeMeta{APIVersion: cpv1alpha1.GroupVersion.String(), Kind: "ClusterProfile"},
		ObjectMeta: &meta,
		Spec:       &p.Spec,
		Status: statusFields{
			Conditions:          st.Conditions,
			Properties:          st.Properties,
			CredentialProviders: st.CredentialProviders,
			AccessProviders:     st.AccessProviders,
		},
	}
	if st.Version != (cpv1alpha1.ClusterVersion{}) {
		doc.Status.Version = &st.Version
	}
	body, err := json.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("encode profile %s/%s: %w", p.Namespace, p.Name, err)
	}
	return body, nil
}

// statusDocument is a ClusterProfile as StatusBody writes it.
type statusDocument struct {
	metav1.TypeMeta `json:",inline"`
	ObjectMeta      *metav1.ObjectMeta             `json:"metadata"`
	Spec            *cpv1alpha1.ClusterProfileSpec `json:"spec"`
	Status          statusFields                   `json:"status"`
}

// statusFields has every field of cpv1alpha1.ClusterProfileStatus, each
// left out when empty.
type statusFields struct {
	Conditions          []metav1.Condition              `json:"conditions,omitempty"`
	Version             *cpv1alpha1.ClusterVersion      `json:"version,omitempty"`
	Properties          []cpv1alpha1.Property           `json:"properties,omitempty"`
	CredentialProviders []cpv1alpha1.CredentialProvider `json:"credentialProviders,omitempty"`
	AccessProviders     []cpv1alpha1.AccessProvider     `json:"accessProviders,omitempty"`
}

// writeStatus replaces p's status on the server (guarded by p's
// resourceVersion) with the body StatusBody makes, as FieldManager.
func (s *Syncer) writeStatus(ctx context.Context, p *cpv1alpha1.ClusterProfile) (*cpv1alpha1.ClusterProfile, error) {
	client := s.clients.Profiles.ApisV1alpha1()
	rc, ok := client.RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		// A fake clientset has no REST client; its tracker stores the typed
		// object anyway.
		return client.ClusterProfiles(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: FieldManager})
	}
	body, err := StatusBody(p)
	if err != nil {
		return nil, err
	}
	out := &cpv1alpha1.ClusterProfile{}
	err = rc.Put().
		Namespace(p.Namespace).
		Resource("clusterprofiles").
		Name(p.Name).
		SubResource("status").
		Param("fieldManager", FieldManager).
		Body(body).
		Do(ctx).
		Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}
