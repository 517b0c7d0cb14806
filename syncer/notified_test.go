package syncer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hubsync/hubsync/stream"
)

func TestNotifiedOverlay(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 4, 0, 0, 0, time.UTC)
	profile := func(typ, name, rv string) stream.Change {
		return stream.Change{Type: typ, Namespace: "team-a", Cluster: name, Name: name, ResourceVersion: rv, Profile: &stream.ProfileSummary{}}
	}
	copyOf := func(typ, cluster, rv string) stream.Change {
		return stream.Change{Type: typ, Namespace: "team-a", Cluster: cluster, Name: cluster + "-kueue", ResourceVersion: rv,
			Credential: &stream.CredentialSummary{ManagedServiceAccount: "kueue", Secret: cluster + "-kueue"}}
	}
	tests := []struct {
		name   string
		noted  []stream.Change
		cached []stream.Change
		at     time.Duration // after the notes
		want   []string      // type/name@rv, sorted
		kept   int           // notes still remembered
	}{
		{name: "cache caught up", noted: []stream.Change{profile(stream.ProfileCreated, "c1", "5")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "5")}, want: []string{"io.hubsync.profile.updated/c1@5"}},
		{name: "created, not in the cache yet", noted: []stream.Change{profile(stream.ProfileCreated, "c1", "5")},
			want: []string{"io.hubsync.profile.updated/c1@5"}, kept: 1},
		{name: "cache behind an update", noted: []stream.Change{profile(stream.ProfileUpdated, "c1", "9")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "5")}, want: []string{"io.hubsync.profile.updated/c1@9"}, kept: 1},
		{name: "deleted, the cache still shows it", noted: []stream.Change{profile(stream.ProfileDeleted, "c1", "9")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "9")}, want: nil, kept: 1},
		{name: "deleted and gone", noted: []stream.Change{profile(stream.ProfileDeleted, "c1", "9")}, want: nil},
		{name: "deleted, then a new one is in the cache", noted: []stream.Change{profile(stream.ProfileDeleted, "c1", "9")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "12")}, want: []string{"io.hubsync.profile.updated/c1@12"}},
		{name: "copy rotated, cache behind", noted: []stream.Change{copyOf(stream.CredentialRotated, "c1", "7")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "5"), copyOf(stream.CredentialSynced, "c1", "6")},
			want:   []string{"io.hubsync.credential.synced/c1-kueue@7", "io.hubsync.profile.updated/c1@5"}, kept: 1},
		{name: "copy removed, cache behind", noted: []stream.Change{copyOf(stream.CredentialRemoved, "c1", "7")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "5"), copyOf(stream.CredentialSynced, "c1", "7")},
			want:   []string{"io.hubsync.profile.updated/c1@5"}, kept: 1},
		{name: "expired notes give way to the cache", noted: []stream.Change{profile(stream.ProfileCreated, "c1", "9"), profile(stream.ProfileCreated, "c2", "3")},
			cached: []stream.Change{profile(stream.ProfileUpdated, "c1", "5")}, at: 2 * time.Minute, want: []string{"io.hubsync.profile.updated/c1@5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNotifiedState(time.Minute)
			for _, c := range tt.noted {
				n.note(c)
			}
			for k, v := range n.m {
				v.at = t0
				n.m[k] = v
			}
			var got []string
			for _, c := range n.overlay(tt.cached, t0.Add(tt.at)) {
				got = append(got, fmt.Sprintf("%s/%s@%s", c.Type, c.Name, c.ResourceVersion))
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("snapshot %v, want %v", got, tt.want)
			}
			if len(n.m) != tt.kept {
				t.Errorf("%d notes kept, want %d", len(n.m), tt.kept)
			}
		})
	}
}
