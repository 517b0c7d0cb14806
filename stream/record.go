package stream

import (
	"slices"
	"strings"
	"time"
)

// Record is what a consumer has been told about one (namespace, cluster):
// the profile's summary and one summary per synced credential. The NATS
// bus stores it as its KV access record (schema record.v1.json); other
// consumers use Records to announce what they missed on a resync.
type Record struct {
	Namespace string          `json:"namespace"`
	Cluster   string          `json:"cluster"`
	Profile   *ProfileSummary `json:"profile,omitempty"`
	// Credentials holds one entry per synced ManagedServiceAccount, sorted
	// by its name; never null in JSON.
	Credentials []CredentialSummary `json:"credentials"`
	// Updated is the time of the last change applied to the record.
	Updated time.Time `json:"updated"`
	// ProfileResourceVersion is the profile's resourceVersion in the last
	// change applied, when known. It lets a removal announced on a resync
	// share its id with the deletion it stands for.
	ProfileResourceVersion string `json:"-"`
}

// Records is a consumer's picture of what it was told, built from the
// changes it delivered.
type Records map[Key]*Record

// Apply updates the records with one change. It returns the record after
// the change (nil when nothing is left to say about the pair) and whether
// the change touched the records at all.
func (rs Records) Apply(c Change, now time.Time) (*Record, bool) {
	key := c.Key()
	if c.Type == ProfileDeleted {
		_, had := rs[key]
		delete(rs, key)
		return nil, had
	}
	old := rs[key]
	r := &Record{Namespace: c.Namespace, Cluster: c.Cluster}
	if old != nil {
		cp := *old
		r = &cp
	}
	switch {
	case IsProfileType(c.Type):
		if c.Profile != nil {
			r.Profile = c.Profile
		} else if r.Profile == nil {
			r.Profile = &ProfileSummary{}
		}
		r.ProfileResourceVersion = c.ResourceVersion
	case c.Type == CredentialSynced || c.Type == CredentialRotated:
		if c.Credential == nil {
			return old, false
		}
		r.Credentials = setCredential(r.Credentials, *c.Credential)
	case c.Type == CredentialRemoved:
		msa := ""
		if c.Credential != nil {
			msa = c.Credential.ManagedServiceAccount
		} else {
			// The copy's Secret is named <cluster>-<msa>.
			msa = strings.TrimPrefix(c.Name, c.Cluster+"-")
		}
		r.Credentials = removeCredential(r.Credentials, msa)
	default:
		return old, false
	}
	if r.Profile == nil && len(r.Credentials) == 0 {
		delete(rs, key)
		return nil, true
	}
	r.Updated = c.Time.UTC()
	if c.Time.IsZero() {
		r.Updated = now.UTC()
	}
	rs[key] = r
	return r, true
}

// IsProfileType reports whether a change type announces a profile's
// current state (created, updated, access providers updated).
func IsProfileType(t string) bool {
	return t == ProfileCreated || t == ProfileUpdated || t == AccessProviderUpdated
}

// Removals are the changes that take a consumer from record old to record
// cur (nil when the pair has no record): credential.removed for each
// credential no longer there, then profile.deleted if the profile is gone.
func Removals(old, cur *Record, now time.Time) []Change {
	if old == nil {
		return nil
	}
	var out []Change
	for _, c := range old.Credentials {
		if cur != nil && slices.ContainsFunc(cur.Credentials, func(n CredentialSummary) bool {
			return n.ManagedServiceAccount == c.ManagedServiceAccount
		}) {
			continue
		}
		out = append(out, Change{
			Type: CredentialRemoved, Namespace: old.Namespace, Cluster: old.Cluster,
			Name: c.Secret, ResourceVersion: c.ResourceVersion, Time: now, Credential: &c,
		})
	}
	if old.Profile != nil && (cur == nil || cur.Profile == nil) {
		out = append(out, Change{
			Type: ProfileDeleted, Namespace: old.Namespace, Cluster: old.Cluster,
			Name: old.Cluster, ResourceVersion: old.ProfileResourceVersion, Time: now, Profile: old.Profile,
		})
	}
	return out
}

// Plan compares a snapshot of the current state with what a consumer was
// told. It returns the records the snapshot stands for and the changes to
// deliver: the snapshot's own, then a removal for every profile or
// credential the consumer was told of that no longer exists (its change was
// dropped, or happened while the consumer was away), in key order.
func Plan(told Records, snapshot []Change, now time.Time) (Records, []Change) {
	fresh := Records{}
	for _, c := range snapshot {
		if c.Namespace != "" && c.Cluster != "" {
			fresh.Apply(c, now)
		}
	}
	out := slices.Clone(snapshot)
	keys := make([]Key, 0, len(told))
	for k := range told {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		out = append(out, Removals(told[k], fresh[k], now)...)
	}
	return fresh, out
}

func compareKeys(a, b Key) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Cluster, b.Cluster)
}

func setCredential(list []CredentialSummary, c CredentialSummary) []CredentialSummary {
	i, found := slices.BinarySearchFunc(list, c.ManagedServiceAccount, func(e CredentialSummary, msa string) int {
		return strings.Compare(e.ManagedServiceAccount, msa)
	})
	out := slices.Clone(list)
	if found {
		out[i] = c
		return out
	}
	return slices.Insert(out, i, c)
}

func removeCredential(list []CredentialSummary, msa string) []CredentialSummary {
	return slices.DeleteFunc(slices.Clone(list), func(c CredentialSummary) bool { return c.ManagedServiceAccount == msa })
}
