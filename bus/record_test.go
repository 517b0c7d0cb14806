package bus

import (
	"encoding/json"
	"testing"

	"github.com/hubsync/hubsync/syncer"
)

func TestRecordsApply(t *testing.T) {
	rs := records{}
	key := KVKey("team-a", "c.1")
	created := profileChange(syncer.ChangeProfileCreated, "team-a", "c.1", "1")
	updated := profileChange(syncer.ChangeAccessProviderUpdated, "team-a", "c.1", "2")
	updated.Profile.AccessProviders = append(updated.Profile.AccessProviders, syncer.AccessProviderSummary{Name: "direct", Server: "https://c1:6443"})
	for _, step := range []struct {
		name      string
		change    syncer.Change
		deleted   bool
		msas      []string
		providers int
	}{
		{name: "credential before profile", change: credentialChange(syncer.ChangeCredentialSynced, "team-a", "c.1", "zeta", "1"), msas: []string{"zeta"}},
		{name: "profile created", change: created, msas: []string{"zeta"}, providers: 1},
		{name: "second credential sorts first", change: credentialChange(syncer.ChangeCredentialSynced, "team-a", "c.1", "alpha", "2"), msas: []string{"alpha", "zeta"}, providers: 1},
		{name: "rotation replaces", change: credentialChange(syncer.ChangeCredentialRotated, "team-a", "c.1", "zeta", "3"), msas: []string{"alpha", "zeta"}, providers: 1},
		{name: "access providers", change: updated, msas: []string{"alpha", "zeta"}, providers: 2},
		{name: "credential removed", change: credentialChange(syncer.ChangeCredentialRemoved, "team-a", "c.1", "alpha", "4"), msas: []string{"zeta"}, providers: 2},
		{name: "profile deleted", change: profileChange(syncer.ChangeProfileDeleted, "team-a", "c.1", "5"), deleted: true},
		{name: "late credential removal of a deleted profile", change: credentialChange(syncer.ChangeCredentialRemoved, "team-a", "c.1", "zeta", "6"), deleted: true},
	} {
		op, ok := rs.apply(step.change, t0)
		if !ok || op.key != key {
			t.Fatalf("%s: op %+v, %v", step.name, op, ok)
		}
		if step.deleted {
			if op.value != nil || rs[key] != nil {
				t.Fatalf("%s: want the key deleted, got %s", step.name, op.value)
			}
			continue
		}
		if err := ValidateRecord(op.value); err != nil {
			t.Errorf("%s: %v", step.name, err)
		}
		var r Record
		if err := json.Unmarshal(op.value, &r); err != nil {
			t.Fatal(err)
		}
		var msas []string
		for _, c := range r.Credentials {
			msas = append(msas, c.ManagedServiceAccount)
		}
		if len(msas) != len(step.msas) || (len(msas) > 0 && msas[0] != step.msas[0]) || (len(msas) > 1 && msas[1] != step.msas[1]) {
			t.Errorf("%s: credentials %v, want %v", step.name, msas, step.msas)
		}
		if got := 0; r.Profile != nil {
			got = len(r.Profile.AccessProviders)
			if got != step.providers {
				t.Errorf("%s: %d access providers, want %d", step.name, got, step.providers)
			}
		} else if step.providers != 0 {
			t.Errorf("%s: no profile", step.name)
		}
		if r.Namespace != "team-a" || r.Cluster != "c.1" || !r.Updated.Equal(t0) {
			t.Errorf("%s: record %+v", step.name, r)
		}
	}
	if _, ok := rs.apply(syncer.Change{Type: "io.hubsync.tunnel.down", Namespace: "n", Cluster: "c"}, t0); ok {
		t.Error("a tunnel event changed the KV")
	}
}
