package events

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hubsync/hubsync/stream"
)

// ParseType reads a type filter, as `hubsync events --type` takes it: a full type (io.hubsync.profile.updated), a short
// one (profile.updated) or a kind (profile, credential, accessprovider,
// tunnel), of the change types the stream defines. It returns the subject
// kind and the full type ("" for a whole kind).
func ParseType(s string) (kind, full string, err error) {
	if s == "" {
		return "", "", nil
	}
	short := strings.TrimPrefix(s, TypePrefix)
	var kinds, types []string
	for _, t := range stream.Types {
		k, err := Kind(t)
		if err != nil {
			return "", "", err
		}
		switch {
		case t == TypePrefix+short:
			return k, t, nil
		case k == short:
			return k, "", nil
		}
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
		types = append(types, strings.TrimPrefix(t, TypePrefix))
	}
	return "", "", fmt.Errorf("unknown event type %q: want a kind (%s) or a type (%s), with or without %q",
		s, strings.Join(kinds, ", "), strings.Join(types, ", "), TypePrefix)
}

// Line is the readable one-line form of an event (`hubsync events -o text`):
//
//	2026-11-21T04:00:00Z profile.created        team-ml/eu-prod-01  v1.35.4 healthy=True providers=open-cluster-management
//	2026-11-21T04:00:00Z credential.rotated     team-ml/eu-prod-01  secret=eu-prod-01-kueue fp=sha256:… expires=…
//	2026-11-21T04:00:00Z tunnel.failing         team-ml/eu-prod-01  state=failing transport=konnectivity reason="…" since=…
func Line(ev *Event) string {
	when := "-"
	if t, err := time.Parse(time.RFC3339Nano, ev.Time); err == nil {
		when = t.UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	where := ev.Subject
	if ev.Data.Namespace != "" || ev.Data.Cluster != "" {
		where = ev.Data.Namespace + "/" + ev.Data.Cluster
	}
	var details []string
	if p := ev.Data.Profile; p != nil {
		if p.KubernetesVersion != "" {
			details = append(details, p.KubernetesVersion)
		}
		if p.Healthy != "" {
			details = append(details, "healthy="+p.Healthy)
		}
		if len(p.AccessProviders) > 0 {
			details = append(details, "providers="+ProviderNames(p.AccessProviders))
		}
	}
	if c := ev.Data.Credential; c != nil {
		details = append(details, "secret="+c.Secret)
		if c.Fingerprint != "" {
			details = append(details, "fp="+c.Fingerprint)
		}
		if c.Expiration != nil {
			details = append(details, "expires="+c.Expiration.UTC().Format(time.RFC3339))
		}
	}
	if tn := ev.Data.Tunnel; tn != nil {
		details = append(details, tunnelDetails(tn)...)
	}
	return strings.TrimRight(fmt.Sprintf("%s %-22s %s  %s", when, strings.TrimPrefix(ev.Type, TypePrefix), where, strings.Join(details, " ")), " ")
}

// tunnelDetails are a tunnel event's fields: its state, transport, probe
// round trip (ready) or reason (failing, quoted: it is a sentence), and
// since when.
func tunnelDetails(tn *stream.TunnelSummary) []string {
	details := []string{"state=" + tn.State}
	if tn.Transport != "" {
		details = append(details, "transport="+tn.Transport)
	}
	if tn.ProbeMillis > 0 {
		details = append(details, "probe="+strconv.FormatFloat(tn.ProbeMillis, 'f', -1, 64)+"ms")
	}
	if tn.Reason != "" {
		details = append(details, "reason="+strconv.Quote(tn.Reason))
	}
	if !tn.Since.IsZero() {
		details = append(details, "since="+tn.Since.UTC().Format(time.RFC3339))
	}
	return details
}

// ProviderNames joins the names of access providers with commas.
func ProviderNames(ps []stream.AccessProviderSummary) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}
