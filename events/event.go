package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hubsync/hubsync/stream"
)

// The event contract, version 1. A change that is not backwards compatible
// gets a new schema URL (v2) rather than changing this one.
const (
	// SpecVersion is the CloudEvents version of every event.
	SpecVersion = "1.0"
	// EventSchemaURL is the dataschema of every event (Schema returns it).
	EventSchemaURL = "https://hubsync.io/schemas/event/v1.json"
	// RecordSchemaURL identifies the schema of KV access records.
	RecordSchemaURL = "https://hubsync.io/schemas/record/v1.json"
	// DataContentType of every event's data.
	DataContentType = "application/json"
	// ContentType is the NATS Content-Type header of every message
	// (CloudEvents NATS binding, structured mode).
	ContentType = "application/cloudevents+json"
	// TypePrefix starts every event type: io.hubsync.<kind>.<verb>.
	TypePrefix = "io.hubsync."
)

// Event is one CloudEvent as hubsync publishes it (structured JSON mode).
type Event struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Subject         string `json:"subject"`
	Time            string `json:"time"`
	DataContentType string `json:"datacontenttype"`
	DataSchema      string `json:"dataschema"`
	Data            Data   `json:"data"`
}

// Data is an event's payload. It never holds a token or key.
type Data struct {
	Namespace       string `json:"namespace"`
	Cluster         string `json:"cluster"`
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
	// Profile is set for profile.* and accessprovider.updated events.
	Profile *stream.ProfileSummary `json:"profile,omitempty"`
	// Credential is set for credential.* events.
	Credential *stream.CredentialSummary `json:"credential,omitempty"`
	// Tunnel is set for tunnel.* events.
	Tunnel *stream.TunnelSummary `json:"tunnel,omitempty"`
}

// ID is the CloudEvents id of a change and its JetStream Nats-Msg-Id:
// the first 32 lowercase hex digits (128 bits) of the SHA-256 of type,
// namespace, cluster, name and resourceVersion joined by '\n'. The same
// change published twice has the same id, so JetStream stores it once
// within the stream's duplicate window.
func ID(c stream.Change) string {
	h := sha256.New()
	for i, s := range []string{c.Type, c.Namespace, c.Cluster, c.Name, c.ResourceVersion} {
		if i > 0 {
			h.Write([]byte{'\n'})
		}
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Kind is the subject kind of an event type: "profile" for
// io.hubsync.profile.created, "credential", "accessprovider", and so on.
func Kind(eventType string) (string, error) {
	rest, ok := strings.CutPrefix(eventType, TypePrefix)
	kind, verb, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || kind == "" || verb == "" || EscapeToken(kind) != kind {
		return "", fmt.Errorf("event type %q is not %s<kind>.<verb>", eventType, TypePrefix)
	}
	return kind, nil
}

// New builds the event of a change (time is c.Time in UTC, or now if
// c.Time is zero); source is the CloudEvents source,
// for example "hubsync/open-cluster-management".
func New(c stream.Change, source string) (Event, error) {
	if err := CheckChange(c); err != nil {
		return Event{}, err
	}
	if source == "" {
		return Event{}, errors.New("event source is empty")
	}
	e := Event{
		SpecVersion:     SpecVersion,
		ID:              ID(c),
		Source:          source,
		Type:            c.Type,
		Subject:         c.Namespace + "/" + c.Cluster,
		DataContentType: DataContentType,
		DataSchema:      EventSchemaURL,
		Data: Data{
			Namespace:       c.Namespace,
			Cluster:         c.Cluster,
			Name:            c.Name,
			ResourceVersion: c.ResourceVersion,
		},
	}
	t := c.Time
	if t.IsZero() {
		// The contract requires a time; the syncer always sets one.
		t = time.Now()
	}
	e.Time = t.UTC().Format(time.RFC3339Nano)
	// Profile events always carry a profile (possibly {}), credential
	// events a credential, and never the other.
	switch kind, _ := Kind(c.Type); kind {
	case "profile", "accessprovider":
		e.Data.Profile = c.Profile
		if e.Data.Profile == nil {
			e.Data.Profile = &stream.ProfileSummary{}
		}
	case "credential":
		e.Data.Credential = c.Credential
		if e.Data.Credential == nil {
			// The copy's Secret is named <cluster>-<msa>.
			e.Data.Credential = &stream.CredentialSummary{
				ManagedServiceAccount: strings.TrimPrefix(c.Name, c.Cluster+"-"),
				Secret:                c.Name,
			}
		}
	case "tunnel":
		e.Data.Tunnel = c.Tunnel
		if e.Data.Tunnel == nil {
			// The verb is the state: io.hubsync.tunnel.ready says ready.
			_, verb, _ := strings.Cut(strings.TrimPrefix(c.Type, TypePrefix), ".")
			e.Data.Tunnel = &stream.TunnelSummary{State: verb, Since: c.Time.UTC()}
		}
	}
	return e, nil
}

// Encode returns the CloudEvents 1.0 JSON (structured mode) of a change.
func Encode(c stream.Change, source string) ([]byte, error) {
	e, err := New(c, source)
	if err != nil {
		return nil, err
	}
	return json.Marshal(e)
}

// Decode parses an event published by hubsync and checks its envelope.
func Decode(data []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(data, &e); err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	if e.SpecVersion != SpecVersion {
		return Event{}, fmt.Errorf("decode event: specversion %q, want %q", e.SpecVersion, SpecVersion)
	}
	if e.ID == "" || e.Source == "" || e.Type == "" {
		return Event{}, errors.New("decode event: id, source and type are required")
	}
	return e, nil
}

// CheckChange rejects a change that cannot become an event.
func CheckChange(c stream.Change) error {
	if _, err := Kind(c.Type); err != nil {
		return err
	}
	if c.Namespace == "" || c.Cluster == "" {
		return fmt.Errorf("change %s has an empty namespace or cluster (%q/%q)", c.Type, c.Namespace, c.Cluster)
	}
	return nil
}
