package bus

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

func TestRecordsApply(t *testing.T) {
	rs := stream.Records{}
	key := events.KVKey("team-a", "c.1")
	created := streamtest.Profile(stream.ProfileCreated, "team-a", "c.1", "1")
	updated := streamtest.Profile(stream.AccessProviderUpdated, "team-a", "c.1", "2")
	updated.Profile.AccessProviders = append(updated.Profile.AccessProviders, stream.AccessProviderSummary{Name: "direct", Server: "https://c1:6443"})
	for _, step := range []struct {
		name      string
		change    stream.Change
		deleted   bool
		msas      []string
		providers int
	}{
		{name: "credential before profile", change: streamtest.Credential(stream.CredentialSynced, "team-a", "c.1", "zeta", "1"), msas: []string{"zeta"}},
		{name: "profile created", change: created, msas: []string{"zeta"}, providers: 1},
		{name: "second credential sorts first", change: streamtest.Credential(stream.CredentialSynced, "team-a", "c.1", "alpha", "2"), msas: []string{"alpha", "zeta"}, providers: 1},
		{name: "rotation replaces", change: streamtest.Credential(stream.CredentialRotated, "team-a", "c.1", "zeta", "3"), msas: []string{"alpha", "zeta"}, providers: 1},
		{name: "access providers", change: updated, msas: []string{"alpha", "zeta"}, providers: 2},
		{name: "credential removed", change: streamtest.Credential(stream.CredentialRemoved, "team-a", "c.1", "alpha", "4"), msas: []string{"zeta"}, providers: 2},
		{name: "profile deleted", change: streamtest.Profile(stream.ProfileDeleted, "team-a", "c.1", "5"), deleted: true},
		{name: "late credential removal of a deleted profile", change: streamtest.Credential(stream.CredentialRemoved, "team-a", "c.1", "zeta", "6"), deleted: true},
	} {
		op, ok := kvOpFor(rs, step.change, streamtest.Time)
		if !ok || op.key != key {
			t.Fatalf("%s: op %+v, %v", step.name, op, ok)
		}
		if step.deleted {
			if op.value != nil || rs[stream.Key{Namespace: "team-a", Cluster: "c.1"}] != nil {
				t.Fatalf("%s: want the key deleted, got %s", step.name, op.value)
			}
			continue
		}
		if err := events.ValidateRecord(op.value); err != nil {
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
		if r.Namespace != "team-a" || r.Cluster != "c.1" || !r.Updated.Equal(streamtest.Time) {
			t.Errorf("%s: record %+v", step.name, r)
		}
	}
	if _, ok := kvOpFor(rs, stream.Change{Type: "io.hubsync.tunnel.down", Namespace: "n", Cluster: "c"}, streamtest.Time); ok {
		t.Error("a tunnel event changed the KV")
	}
}

func TestRemovals(t *testing.T) {
	cred := func(msa, rv string) stream.CredentialSummary {
		return stream.CredentialSummary{ManagedServiceAccount: msa, Secret: "c1-" + msa, ResourceVersion: rv}
	}
	profile := &stream.ProfileSummary{KubernetesVersion: "v1.35.4"}
	rec := func(p *stream.ProfileSummary, rv string, creds ...stream.CredentialSummary) *Record {
		return &Record{Namespace: "team-a", Cluster: "c1", Profile: p, Credentials: creds, ProfileResourceVersion: rv}
	}
	tests := []struct {
		name     string
		old, cur *Record
		want     []string // type/name/resourceVersion
	}{
		{name: "nothing gone", old: rec(profile, "7", cred("kueue", "3")), cur: rec(profile, "8", cred("kueue", "4"))},
		{name: "pair gone", old: rec(profile, "7", cred("kueue", "3"), cred("argocd", "5")), cur: nil,
			want: []string{"io.hubsync.credential.removed/c1-kueue/3", "io.hubsync.credential.removed/c1-argocd/5", "io.hubsync.profile.deleted/c1/7"}},
		{name: "one credential gone", old: rec(profile, "7", cred("kueue", "3"), cred("argocd", "5")), cur: rec(profile, "7", cred("argocd", "5")),
			want: []string{"io.hubsync.credential.removed/c1-kueue/3"}},
		{name: "profile gone, credential stays", old: rec(profile, "", cred("kueue", "3")), cur: rec(nil, "", cred("kueue", "3")),
			want: []string{"io.hubsync.profile.deleted/c1/"}},
		{name: "only credentials were known", old: rec(nil, "", cred("kueue", "3")), cur: nil,
			want: []string{"io.hubsync.credential.removed/c1-kueue/3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range stream.Removals(tt.old, tt.cur, streamtest.Time) {
				if c.Namespace != "team-a" || c.Cluster != "c1" || events.CheckChange(c) != nil {
					t.Errorf("bad change %+v", c)
				}
				if err := validateChangeEvent(t, c); err != nil {
					t.Error(err)
				}
				got = append(got, c.Type+"/"+c.Name+"/"+c.ResourceVersion)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("removals = %v, want %v", got, tt.want)
			}
		})
	}
}

// validateChangeEvent encodes a change as hubsync publishes it and checks
// the event against the schema.
func validateChangeEvent(t *testing.T, c stream.Change) error {
	t.Helper()
	data, err := events.Encode(c, "hubsync/test")
	if err != nil {
		return err
	}
	return events.ValidateEvent(data)
}

// A batch that failed is retried after its records were applied: its
// changes are announced as they were the first time.
func TestAnnounceUnknownIsStableAcrossRetries(t *testing.T) {
	b := &Bus{recs: stream.Records{}, readStored: true}
	batch := func() []stream.Change {
		return []stream.Change{
			streamtest.Profile(stream.ProfileCreated, "team-a", "new", "1"),
			streamtest.Profile(stream.ProfileUpdated, "team-a", "unknown", "2"),
		}
	}
	first := batch()
	if err := b.announceUnknown(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	for _, c := range first { // what a failed send leaves behind
		kvOpFor(b.recs, c, time.Now())
	}
	retry := batch()
	if err := b.announceUnknown(context.Background(), retry); err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if first[i].Type != stream.ProfileCreated || retry[i].Type != first[i].Type {
			t.Errorf("change %d: first %s, retry %s; want profile.created both times", i, first[i].Type, retry[i].Type)
		}
	}
}
