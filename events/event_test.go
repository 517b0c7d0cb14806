package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

func TestEventID(t *testing.T) {
	c := streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "42")
	id := ID(c)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("ID = %q, want 32 lowercase hex digits", id)
	}
	sum := sha256.Sum256([]byte("io.hubsync.profile.updated\nteam-a\nc1\nc1\n42"))
	if want := hex.EncodeToString(sum[:])[:32]; id != want {
		t.Errorf("ID = %s, want %s (the documented formula)", id, want)
	}
	// What is not part of the identity does not change it.
	same := c
	same.Time = streamtest.Time.Add(time.Hour)
	same.Profile = nil
	if ID(same) != id {
		t.Error("ID depends on time or profile")
	}
	for name, mutate := range map[string]func(*stream.Change){
		"type":            func(c *stream.Change) { c.Type = stream.ProfileCreated },
		"namespace":       func(c *stream.Change) { c.Namespace = "team-b" },
		"cluster":         func(c *stream.Change) { c.Cluster = "c2" },
		"name":            func(c *stream.Change) { c.Name = "c2" },
		"resourceVersion": func(c *stream.Change) { c.ResourceVersion = "43" },
		"field boundary":  func(c *stream.Change) { c.Namespace, c.Cluster = "team-a\nc1", "" },
	} {
		other := c
		mutate(&other)
		if ID(other) == id {
			t.Errorf("changing %s keeps the id", name)
		}
	}
}

func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		change              stream.Change
		profile, credential bool
	}{
		{change: streamtest.Profile(stream.ProfileCreated, "team-a", "c1.eu", "1"), profile: true},
		{change: streamtest.Profile(stream.ProfileUpdated, "team-a", "c1", "2"), profile: true},
		{change: streamtest.Profile(stream.ProfileDeleted, "team-a", "c1", "3"), profile: true},
		{change: streamtest.Profile(stream.AccessProviderUpdated, "team-a", "c1", "4"), profile: true},
		{change: streamtest.Credential(stream.CredentialSynced, "team-a", "c1", "msa", "5"), credential: true},
		{change: streamtest.Credential(stream.CredentialRotated, "team-a", "c1", "msa", "6"), credential: true},
		{change: streamtest.Credential(stream.CredentialRemoved, "team-a", "c1", "msa", "7"), credential: true},
	} {
		c := tc.change
		t.Run(c.Type, func(t *testing.T) {
			data, err := Encode(c, "hubsync/open-cluster-management")
			if err != nil {
				t.Fatal(err)
			}
			if err := ValidateEvent(data); err != nil {
				t.Errorf("%s\ndoes not match the event schema: %v", data, err)
			}
			var raw map[string]any
			if err := json.Unmarshal(data, &raw); err != nil {
				t.Fatal(err)
			}
			for attr, want := range map[string]any{
				"specversion":     "1.0",
				"id":              ID(c),
				"source":          "hubsync/open-cluster-management",
				"type":            c.Type,
				"subject":         c.Namespace + "/" + c.Cluster,
				"time":            "2026-03-01T12:00:00Z",
				"datacontenttype": "application/json",
				"dataschema":      "https://hubsync.io/schemas/event/v1.json",
			} {
				if raw[attr] != want {
					t.Errorf("%s = %v, want %v", attr, raw[attr], want)
				}
			}
			data2 := raw["data"].(map[string]any)
			for k, want := range map[string]string{"namespace": c.Namespace, "cluster": c.Cluster, "name": c.Name, "resourceVersion": c.ResourceVersion} {
				if data2[k] != want {
					t.Errorf("data.%s = %v, want %v", k, data2[k], want)
				}
			}
			if _, ok := data2["profile"]; ok != tc.profile {
				t.Errorf("data.profile present = %v, want %v", ok, tc.profile)
			}
			if _, ok := data2["credential"]; ok != tc.credential {
				t.Errorf("data.credential present = %v, want %v", ok, tc.credential)
			}
			if strings.Contains(strings.ToLower(string(data)), "token") {
				t.Errorf("event mentions a token: %s", data)
			}
			e, err := Decode(data)
			if err != nil || e.ID != ID(c) || e.Data.Cluster != c.Cluster {
				t.Errorf("Decode = %+v, %v", e, err)
			}
		})
	}
}

func TestEncodeTimeIsUTC(t *testing.T) {
	c := streamtest.Profile(stream.ProfileUpdated, "ns", "c", "1")
	c.Time = time.Date(2026, 3, 1, 14, 0, 0, 500, time.FixedZone("CET", 3600))
	e, err := New(c, "src")
	if err != nil {
		t.Fatal(err)
	}
	if want := "2026-03-01T13:00:00.0000005Z"; e.Time != want {
		t.Errorf("time = %s, want %s", e.Time, want)
	}
}

func TestEncodeRejects(t *testing.T) {
	good := streamtest.Profile(stream.ProfileUpdated, "ns", "c", "1")
	for name, c := range map[string]stream.Change{
		"foreign type":    func() stream.Change { c := good; c.Type = "com.example.x.y"; return c }(),
		"empty type":      func() stream.Change { c := good; c.Type = ""; return c }(),
		"empty namespace": func() stream.Change { c := good; c.Namespace = ""; return c }(),
		"empty cluster":   func() stream.Change { c := good; c.Cluster = ""; return c }(),
	} {
		if _, err := Encode(c, "src"); err == nil {
			t.Errorf("%s: Encode succeeded", name)
		}
	}
	if _, err := Encode(good, ""); err == nil {
		t.Error("empty source: Encode succeeded")
	}
	for _, bad := range []string{`{}`, `{"specversion":"0.3","id":"x","source":"s","type":"t"}`, `nope`} {
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("Decode(%s) succeeded", bad)
		}
	}
}

// Changes without a summary or a time still make events the contract
// accepts.
func TestEncodeFillsWhatTheContractRequires(t *testing.T) {
	for _, c := range []stream.Change{
		{Type: stream.ProfileDeleted, Namespace: "ns", Cluster: "c.1", Name: "c.1", ResourceVersion: "9"},
		{Type: stream.CredentialRemoved, Namespace: "ns", Cluster: "c.1", Name: "c.1-msa", ResourceVersion: "9"},
	} {
		data, err := Encode(c, "hubsync/x")
		if err != nil {
			t.Fatal(err)
		}
		if err := ValidateEvent(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
		e, _ := Decode(data)
		if c.Type == stream.CredentialRemoved && (e.Data.Credential.ManagedServiceAccount != "msa" || e.Data.Credential.Secret != "c.1-msa") {
			t.Errorf("credential = %+v, want msa from the Secret name", e.Data.Credential)
		}
	}
}
