package sinks

import (
	"errors"
	"maps"
	"testing"

	"github.com/hubsync/hubsync/stream"
)

func TestClustersApply(t *testing.T) {
	profile := &stream.ProfileSummary{}
	cred := func(typ, msa string) stream.Change {
		return stream.Change{Type: typ, Cluster: "c1", Credential: &stream.CredentialSummary{ManagedServiceAccount: msa}}
	}
	tests := []struct {
		name   string
		before *ClusterState // nil: the cluster is not known
		change stream.Change
		msa    string
		want   Applied
		after  *ClusterState // nil: still not known
	}{
		{name: "profile created", change: stream.Change{Type: stream.ProfileCreated, Cluster: "c1", Profile: profile},
			want: AppliedProfile, after: &ClusterState{Profile: profile}},
		{name: "provider updated keeps the credential", before: &ClusterState{Credential: true},
			change: stream.Change{Type: stream.AccessProviderUpdated, Cluster: "c1", Profile: profile},
			want:   AppliedProfile, after: &ClusterState{Profile: profile, Credential: true}},
		{name: "profile change without a profile", change: stream.Change{Type: stream.ProfileUpdated, Cluster: "c1"}},
		{name: "profile deleted", before: &ClusterState{Profile: profile, Credential: true},
			change: stream.Change{Type: stream.ProfileDeleted, Cluster: "c1"},
			want:   AppliedProfile, after: &ClusterState{Credential: true}},
		{name: "credential synced", change: cred(stream.CredentialSynced, "kueue"), msa: "kueue",
			want: AppliedCredential, after: &ClusterState{Credential: true}},
		{name: "credential removed", before: &ClusterState{Profile: profile, Credential: true},
			change: cred(stream.CredentialRemoved, "kueue"), msa: "kueue",
			want: AppliedCredential, after: &ClusterState{Profile: profile}},
		{name: "another MSA's credential", change: cred(stream.CredentialSynced, "other"), msa: "kueue"},
		{name: "credentials ignored", change: cred(stream.CredentialSynced, "kueue")},
		{name: "credential change without a credential", change: stream.Change{Type: stream.CredentialRotated, Cluster: "c1"}, msa: "kueue"},
		{name: "other change", change: stream.Change{Type: "cluster.labels", Cluster: "c1", Profile: profile}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := Clusters{}
			if tc.before != nil {
				st := *tc.before
				cs["c1"] = &st
			}
			if got := cs.Apply(tc.change, tc.msa); got != tc.want {
				t.Errorf("Apply = %v, want %v", got, tc.want)
			}
			switch got := cs["c1"]; {
			case tc.after == nil && tc.before == nil && got != nil:
				t.Errorf("state %+v, want none", *got)
			case tc.after != nil && (got == nil || *got != *tc.after):
				t.Errorf("state %+v, want %+v", got, *tc.after)
			}
		})
	}
}

func TestClustersForgetIfGone(t *testing.T) {
	profile := &stream.ProfileSummary{}
	cs := Clusters{
		"gone":       {},
		"profile":    {Profile: profile},
		"credential": {Credential: true},
		"both":       {Profile: profile, Credential: true},
	}
	for cluster, want := range map[string]bool{"gone": true, "profile": false, "credential": false, "both": false, "unknown": false} {
		if got := cs.ForgetIfGone(cluster); got != want {
			t.Errorf("ForgetIfGone(%s) = %v, want %v", cluster, got, want)
		}
		if _, known := cs[cluster]; known == want && cluster != "unknown" {
			t.Errorf("%s known: %v after ForgetIfGone", cluster, known)
		}
	}
}

func TestRetrySet(t *testing.T) {
	var r RetrySet
	batch := r.Begin()
	if len(batch) != 0 {
		t.Fatalf("a new set holds %v", batch)
	}
	batch["a"], batch["b"] = true, true
	failed := errors.New("write failed")
	r.End(batch, failed)
	next := r.Begin()
	if !maps.Equal(next, map[string]bool{"a": true, "b": true}) {
		t.Fatalf("after a failure the next delivery decides %v, want a and b", next)
	}
	// The next delivery's set is its own: adding to it retries nothing.
	next["c"] = true
	if again := r.Begin(); again["c"] {
		t.Fatal("a delivery's set changed the retry set")
	}
	r.End(next, nil)
	if left := r.Begin(); len(left) != 0 {
		t.Fatalf("after a success %v is left to retry", left)
	}
	r.End(map[string]bool{"d": true}, failed)
	r.Clear()
	if left := r.Begin(); len(left) != 0 {
		t.Fatalf("after Clear %v is left to retry", left)
	}
}
