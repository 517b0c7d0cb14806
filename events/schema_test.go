package events_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
)

// object is a JSON object under test, built from a valid one and mutated.
type object = map[string]any

func profileEvent() object {
	return object{
		"specversion":     "1.0",
		"id":              "0123456789abcdef0123456789abcdef",
		"source":          "hubsync/open-cluster-management",
		"type":            stream.ProfileCreated,
		"subject":         "team-ml/edge.eu-1",
		"time":            "2026-11-21T04:00:00Z",
		"datacontenttype": "application/json",
		"dataschema":      events.EventSchemaURL,
		"data": object{
			"namespace":       "team-ml",
			"cluster":         "edge.eu-1",
			"name":            "edge.eu-1",
			"resourceVersion": "4711",
			"profile": object{
				"labels":            object{"x-k8s.io/cluster-manager": "open-cluster-management"},
				"kubernetesVersion": "v1.35.4",
				"healthy":           "True",
				"joined":            "True",
				"accessProviders": []any{
					object{"name": "open-cluster-management", "server": "https://cluster-proxy-addon-user.open-cluster-management-addon:9092/edge.eu-1"},
				},
			},
		},
	}
}

func credentialEvent() object {
	return object{
		"specversion":     "1.0",
		"id":              "fedcba9876543210fedcba9876543210",
		"source":          "hubsync/open-cluster-management",
		"type":            stream.CredentialRotated,
		"subject":         "team-ml/eu-prod-01",
		"time":            "2026-11-21T04:00:00.123456789Z",
		"datacontenttype": "application/json",
		"dataschema":      events.EventSchemaURL,
		"data": object{
			"namespace":       "team-ml",
			"cluster":         "eu-prod-01",
			"name":            "eu-prod-01-kueue",
			"resourceVersion": "815",
			"credential": object{
				"managedServiceAccount": "kueue",
				"secret":                "eu-prod-01-kueue",
				"resourceVersion":       "815",
				"fingerprint":           "sha256:0123456789abcdef",
				"expiration":            "2026-11-22T04:00:00Z",
			},
		},
	}
}

func record() object {
	return object{
		"namespace": "team-ml",
		"cluster":   "eu-prod-01",
		"profile": object{
			"kubernetesVersion": "v1.35.4",
			"healthy":           "Unknown",
		},
		"credentials": []any{
			object{"managedServiceAccount": "kueue", "secret": "eu-prod-01-kueue", "fingerprint": "sha256:0123456789abcdef", "expiration": "2026-11-22T04:00:00+01:00"},
		},
		"updated": "2026-11-21T04:00:00Z",
	}
}

// at returns the object at a dotted path of o ("" is o itself).
func at(o object, path string) object {
	if path == "" {
		return o
	}
	for _, k := range strings.Split(path, ".") {
		o = o[k].(object)
	}
	return o
}

func set(path, key string, v any) func(object) {
	return func(o object) { at(o, path)[key] = v }
}

func del(path, key string) func(object) {
	return func(o object) { delete(at(o, path), key) }
}

func TestValidateEvent(t *testing.T) {
	v, err := events.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		event   func() object
		mutate  []func(object)
		wantErr string // "" means valid
	}{
		{name: "profile created", event: profileEvent},
		{name: "credential rotated", event: credentialEvent},
		{name: "profile updated without optional fields", event: profileEvent, mutate: []func(object){
			set("", "type", stream.ProfileUpdated), set("data", "profile", object{"healthy": "False"}),
		}},
		{name: "profile deleted with a minimal profile", event: profileEvent, mutate: []func(object){
			set("", "type", stream.ProfileDeleted), set("data", "profile", object{}),
		}},
		{name: "access provider updated", event: profileEvent, mutate: []func(object){set("", "type", stream.AccessProviderUpdated)}},
		{name: "credential synced without expiry", event: credentialEvent, mutate: []func(object){
			set("", "type", stream.CredentialSynced), del("data.credential", "expiration"),
		}},
		{name: "credential removed", event: credentialEvent, mutate: []func(object){
			set("", "type", stream.CredentialRemoved), del("data.credential", "fingerprint"), del("data.credential", "resourceVersion"),
		}},
		{name: "time with offset", event: profileEvent, mutate: []func(object){set("", "time", "2026-11-21T05:00:00+01:00")}},
		{name: "empty resourceVersion", event: profileEvent, mutate: []func(object){set("data", "resourceVersion", "")}},

		{name: "missing id", event: profileEvent, mutate: []func(object){del("", "id")}, wantErr: "missing property 'id'"},
		{name: "uppercase id", event: profileEvent, mutate: []func(object){set("", "id", "0123456789ABCDEF0123456789ABCDEF")}, wantErr: "/id"},
		{name: "uuid id", event: profileEvent, mutate: []func(object){set("", "id", "01234567-89ab-cdef-0123-456789abcdef")}, wantErr: "/id"},
		{name: "bad type", event: profileEvent, mutate: []func(object){set("", "type", "io.hubsync.profile.renamed")}, wantErr: "/type"},
		{name: "short type", event: profileEvent, mutate: []func(object){set("", "type", "profile.created")}, wantErr: "/type"},
		{name: "tunnel type is not v1", event: profileEvent, mutate: []func(object){set("", "type", "io.hubsync.tunnel.down")}, wantErr: "/type"},
		{name: "specversion 0.3", event: profileEvent, mutate: []func(object){set("", "specversion", "0.3")}, wantErr: "/specversion"},
		{name: "other dataschema", event: profileEvent, mutate: []func(object){set("", "dataschema", "https://hubsync.io/schemas/event/v2.json")}, wantErr: "/dataschema"},
		{name: "other content type", event: profileEvent, mutate: []func(object){set("", "datacontenttype", "text/plain")}, wantErr: "/datacontenttype"},
		{name: "time not RFC 3339", event: profileEvent, mutate: []func(object){set("", "time", "21 Nov 2026 04:00")}, wantErr: "/time"},
		{name: "empty source", event: profileEvent, mutate: []func(object){set("", "source", "")}, wantErr: "/source"},
		{name: "missing data", event: profileEvent, mutate: []func(object){del("", "data")}, wantErr: "missing property 'data'"},
		{name: "token attribute", event: profileEvent, mutate: []func(object){set("", "token", "eyJhbGciOi")}, wantErr: "token"},
		{name: "token in data", event: credentialEvent, mutate: []func(object){set("data", "token", "eyJhbGciOi")}, wantErr: "token"},
		{name: "token in credential", event: credentialEvent, mutate: []func(object){set("data.credential", "token", "eyJhbGciOi")}, wantErr: "token"},
		{name: "ca in access provider", event: profileEvent, mutate: []func(object){
			func(o object) {
				at(o, "data.profile")["accessProviders"].([]any)[0].(object)["certificate-authority-data"] = "LS0t"
			},
		}, wantErr: "certificate-authority-data"},
		{name: "token as fingerprint", event: credentialEvent, mutate: []func(object){set("data.credential", "fingerprint", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")}, wantErr: "/data/credential/fingerprint"},
		{name: "token as label value", event: profileEvent, mutate: []func(object){set("data.profile.labels", "token", strings.Repeat("x", 64))}, wantErr: "/data/profile/labels/token"},
		{name: "credential event without credential", event: credentialEvent, mutate: []func(object){del("data", "credential")}, wantErr: "missing property 'credential'"},
		{name: "credential event with a profile", event: credentialEvent, mutate: []func(object){set("data", "profile", object{})}, wantErr: "/data/profile"},
		{name: "profile event without profile", event: profileEvent, mutate: []func(object){del("data", "profile")}, wantErr: "missing property 'profile'"},
		{name: "access provider event without profile", event: profileEvent, mutate: []func(object){
			set("", "type", stream.AccessProviderUpdated), del("data", "profile"),
		}, wantErr: "missing property 'profile'"},
		{name: "profile event with a credential", event: profileEvent, mutate: []func(object){set("data", "credential", at(credentialEvent(), "data.credential"))}, wantErr: "/data/credential"},
		{name: "credential without secret", event: credentialEvent, mutate: []func(object){del("data.credential", "secret")}, wantErr: "missing property 'secret'"},
		{name: "bad healthy", event: profileEvent, mutate: []func(object){set("data.profile", "healthy", "yes")}, wantErr: "/data/profile/healthy"},
		{name: "namespace with a dot", event: profileEvent, mutate: []func(object){set("data", "namespace", "team.ml"), set("", "subject", "team.ml/edge.eu-1")}, wantErr: "/data/namespace"},
		{name: "missing resourceVersion", event: profileEvent, mutate: []func(object){del("data", "resourceVersion")}, wantErr: "missing property 'resourceVersion'"},
		{name: "subject of another cluster", event: profileEvent, mutate: []func(object){set("", "subject", "team-ml/eu-prod-02")}, wantErr: "subject"},
		{name: "subject without cluster", event: profileEvent, mutate: []func(object){set("", "subject", "team-ml")}, wantErr: "/subject"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := tc.event()
			for _, m := range tc.mutate {
				m(ev)
			}
			data, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			check(t, v.ValidateEvent(data), tc.wantErr)
			// The convenience function gives the same answer.
			check(t, events.ValidateEvent(data), tc.wantErr)
		})
	}
}

func TestValidateRecord(t *testing.T) {
	v, err := events.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		mutate  []func(object)
		wantErr string
	}{
		{name: "valid"},
		{name: "no credentials", mutate: []func(object){set("", "credentials", []any{})}},
		{name: "minimal profile", mutate: []func(object){set("", "profile", object{})}},
		{name: "missing credentials", mutate: []func(object){del("", "credentials")}, wantErr: "missing property 'credentials'"},
		{name: "null credentials", mutate: []func(object){set("", "credentials", nil)}, wantErr: "/credentials"},
		{name: "no profile yet", mutate: []func(object){del("", "profile")}},
		{name: "missing updated", mutate: []func(object){del("", "updated")}, wantErr: "missing property 'updated'"},
		{name: "updated not a time", mutate: []func(object){set("", "updated", "yesterday")}, wantErr: "/updated"},
		{name: "token property", mutate: []func(object){set("", "token", "eyJhbGciOi")}, wantErr: "token"},
		{name: "token in a credential", mutate: []func(object){
			func(o object) { o["credentials"].([]any)[0].(object)["token"] = "eyJhbGciOi" },
		}, wantErr: "token"},
		{name: "event as record", mutate: []func(object){set("", "type", stream.ProfileCreated)}, wantErr: "type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record()
			for _, m := range tc.mutate {
				m(rec)
			}
			data, err := json.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			check(t, v.ValidateRecord(data), tc.wantErr)
			check(t, events.ValidateRecord(data), tc.wantErr)
		})
	}
}

// TestSchemasMatchSyncerSummaries checks that what the syncer's summary
// types marshal to, with every field set, is valid in events and records:
// a field added to them must be added to the schemas too.
func TestSchemasMatchSyncerSummaries(t *testing.T) {
	exp := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	p := stream.ProfileSummary{
		Labels:            map[string]string{"x-k8s.io/cluster-manager": "open-cluster-management"},
		KubernetesVersion: "v1.35.4", Healthy: "True", Joined: "Unknown",
		AccessProviders: []stream.AccessProviderSummary{{Name: "open-cluster-management", Server: "https://proxy:9092/eu-prod-01", CAData: []byte("a CA")}},
	}
	c := stream.CredentialSummary{
		ManagedServiceAccount: "kueue", Secret: "eu-prod-01-kueue", ResourceVersion: "7",
		Fingerprint: hub.TokenFingerprint([]byte("a token")), Expiration: &exp,
	}
	raw := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pe := profileEvent()
	at(pe, "data")["profile"] = raw(p)
	ce := credentialEvent()
	at(ce, "data")["credential"] = raw(c)
	for name, ev := range map[string]object{"profile event": pe, "credential event": ce} {
		if err := events.ValidateEvent(raw(ev)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	rec := record()
	rec["profile"], rec["credentials"] = raw(p), raw([]stream.CredentialSummary{c})
	if err := events.ValidateRecord(raw(rec)); err != nil {
		t.Errorf("record: %v", err)
	}
}

// TestSchemaDefinitionsAgree keeps the definitions the two schemas share
// identical: each file is self-contained for consumers who use one only.
func TestSchemaDefinitionsAgree(t *testing.T) {
	defs := func(url string) map[string]json.RawMessage {
		data, err := events.Schema(url)
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Defs map[string]json.RawMessage `json:"$defs"`
		}
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		return s.Defs
	}
	event, record := defs(events.EventSchemaURL), defs(events.RecordSchemaURL)
	for name, r := range record {
		e, ok := event[name]
		if !ok {
			t.Errorf("record $defs/%s is not in the event schema", name)
			continue
		}
		var a, b bytes.Buffer
		if err := json.Compact(&a, e); err != nil {
			t.Fatal(err)
		}
		if err := json.Compact(&b, r); err != nil {
			t.Fatal(err)
		}
		if a.String() != b.String() {
			t.Errorf("$defs/%s differs:\nevent:  %s\nrecord: %s", name, a.String(), b.String())
		}
	}
}

func check(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("want valid, got %v", err)
	case wantErr != "" && err == nil:
		t.Errorf("want an error mentioning %q, got valid", wantErr)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Errorf("want an error mentioning %q, got %v", wantErr, err)
	}
}

// TestDocsExamples keeps the examples in docs/events.md true: every JSON
// block there is a valid event (with the id hubsync would give it) or a
// valid record.
func TestDocsExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```json\n")[1:]
	if len(blocks) < 8 {
		t.Fatalf("found %d JSON examples in docs/events.md, want one per event type and a record", len(blocks))
	}
	types := map[string]bool{}
	for i, b := range blocks {
		example := []byte(b[:strings.Index(b, "```")])
		var head struct {
			SpecVersion string `json:"specversion"`
			ID          string `json:"id"`
			Type        string `json:"type"`
			Data        struct {
				Namespace, Cluster, Name, ResourceVersion string
			} `json:"data"`
		}
		if err := json.Unmarshal(example, &head); err != nil {
			t.Errorf("example %d: %v", i+1, err)
			continue
		}
		if head.SpecVersion == "" {
			if err := events.ValidateRecord(example); err != nil {
				t.Errorf("example %d (a record): %v", i+1, err)
			}
			continue
		}
		types[head.Type] = true
		if err := events.ValidateEvent(example); err != nil {
			t.Errorf("example %d (%s): %v", i+1, head.Type, err)
		}
		d := head.Data
		if id := events.ID(stream.Change{Type: head.Type, Namespace: d.Namespace, Cluster: d.Cluster, Name: d.Name, ResourceVersion: d.ResourceVersion}); id != head.ID {
			t.Errorf("example %d (%s): id %s, but hubsync would send %s", i+1, head.Type, head.ID, id)
		}
	}
	if len(types) != len(stream.Types) {
		t.Errorf("docs/events.md has examples of %d event types, want all %d", len(types), len(stream.Types))
	}
}
