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
func StatusBody(p *cpv1alpha1.ClusterProfile) ([]byte, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode profile %s/%s: %w", p.Namespace, p.Name, err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decode profile %s/%s: %w", p.Namespace, p.Name, err)
	}
	// Objects from a typed client carry no TypeMeta; the server needs it.
	obj["apiVersion"] = cpv1alpha1.GroupVersion.String()
	obj["kind"] = "ClusterProfile"
	if st, ok := obj["status"].(map[string]any); ok {
		if v, ok := st["version"].(map[string]any); ok && len(v) == 0 {
			delete(st, "version")
		}
		if c, ok := st["conditions"].([]any); st["conditions"] == nil || (ok && len(c) == 0) {
			delete(st, "conditions")
		}
	}
	return json.Marshal(obj)
}

// writeStatus replaces p's status on the server (guarded by p's
// resourceVersion) with the body StatusBody makes.
func (s *Syncer) writeStatus(ctx context.Context, p *cpv1alpha1.ClusterProfile) (*cpv1alpha1.ClusterProfile, error) {
	client := s.clients.Profiles.ApisV1alpha1()
	rc, ok := client.RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		// A fake clientset has no REST client; its tracker stores the typed
		// object anyway.
		return client.ClusterProfiles(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
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
		Body(body).
		Do(ctx).
		Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}
