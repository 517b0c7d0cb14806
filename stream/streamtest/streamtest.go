// Package streamtest holds fixtures for unit tests of the change stream's
// producers and consumers: changes shaped as the syncer emits them, so the
// bus, the event contract and the sinks test against one definition. It
// may import stream and hub only.
package streamtest

import (
	"time"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// Time is the time of every fixture change.
var Time = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Profile is a profile change of cluster in namespace ns at resourceVersion
// rv, with one access provider and healthy, joined status.
func Profile(typ, ns, cluster, rv string) stream.Change {
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: cluster, ResourceVersion: rv, Time: Time,
		Profile: &stream.ProfileSummary{
			Labels:            map[string]string{"x-k8s.io/cluster-manager": "open-cluster-management"},
			KubernetesVersion: "v1.35.4", Healthy: "True", Joined: "True",
			AccessProviders: []stream.AccessProviderSummary{{Name: "open-cluster-management", Server: "https://proxy:9092/" + cluster}},
		},
	}
}

// Credential is a credential change of the copy of msa's token for cluster
// in namespace ns, expiring an hour after Time.
func Credential(typ, ns, cluster, msa, rv string) stream.Change {
	exp := Time.Add(time.Hour)
	name := hub.CopyName(cluster, msa)
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: name, ResourceVersion: rv, Time: Time,
		Credential: &stream.CredentialSummary{
			ManagedServiceAccount: msa, Secret: name, ResourceVersion: rv,
			Fingerprint: "sha256:0123456789abcdef", Expiration: &exp,
		},
	}
}
