package bus

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hubsync/hubsync/syncer"
)

// Record is the KV access record of one (namespace, cluster), stored under
// KVKey(namespace, cluster): what a consumer needs to reach the cluster,
// without hub access and without any secret. Its JSON schema is
// RecordSchemaURL (schema/record.v1.json).
type Record struct {
	Namespace string                 `json:"namespace"`
	Cluster   string                 `json:"cluster"`
	Profile   *syncer.ProfileSummary `json:"profile,omitempty"`
	// Credentials holds one entry per synced ManagedServiceAccount, sorted
	// by its name; never null.
	Credentials []syncer.CredentialSummary `json:"credentials"`
	// Updated is the time of the last change applied to the record.
	Updated time.Time `json:"updated"`

	// profileRV is the profile's resourceVersion in the last change
	// applied, when known (not stored in the bucket).
	profileRV string
}

// kvOp is one write to the KV bucket: a put of value, or a delete when
// value is nil.
type kvOp struct {
	key   string
	value []byte
}

// records is the in-memory picture of the KV bucket, built from the change
// stream. Only the publisher goroutine uses it.
type records map[string]*Record

// apply updates the records with one change and returns the KV write that
// mirrors it; ok is false when the change does not touch the KV.
func (rs records) apply(c syncer.Change, now time.Time) (op kvOp, ok bool) {
	key := KVKey(c.Namespace, c.Cluster)
	kind, err := Kind(c.Type)
	if err != nil {
		return kvOp{}, false
	}
	if c.Type == syncer.ChangeProfileDeleted {
		delete(rs, key)
		return kvOp{key: key}, true
	}
	r := rs[key]
	if r == nil {
		r = &Record{Namespace: c.Namespace, Cluster: c.Cluster}
	}
	switch {
	case kind == "profile" || c.Type == syncer.ChangeAccessProviderUpdated:
		if c.Profile != nil {
			r.Profile = c.Profile
		} else if r.Profile == nil {
			r.Profile = &syncer.ProfileSummary{}
		}
		r.profileRV = c.ResourceVersion
	case c.Type == syncer.ChangeCredentialSynced || c.Type == syncer.ChangeCredentialRotated:
		if c.Credential == nil {
			return kvOp{}, false
		}
		r.Credentials = setCredential(r.Credentials, *c.Credential)
	case c.Type == syncer.ChangeCredentialRemoved:
		msa := ""
		if c.Credential != nil {
			msa = c.Credential.ManagedServiceAccount
		} else {
			// The copy's Secret is named <cluster>-<msa>.
			msa = strings.TrimPrefix(c.Name, c.Cluster+"-")
		}
		r.Credentials = removeCredential(r.Credentials, msa)
	default:
		return kvOp{}, false
	}
	if r.Profile == nil && len(r.Credentials) == 0 {
		// Nothing left to say about this pair.
		delete(rs, key)
		return kvOp{key: key}, true
	}
	r.Updated = c.Time.UTC()
	if c.Time.IsZero() {
		r.Updated = now.UTC()
	}
	rs[key] = r
	return r.put(key), true
}

// removals are the changes that take a consumer from record old to record
// cur (nil when the pair has no record): credential.removed for each
// credential no longer there, then profile.deleted if the profile is gone.
// A profile removal carries the last resourceVersion hubsync published
// for it in this run, if any, so that it shares its id with the deletion
// it stands for.
func removals(old, cur *Record, now time.Time) []syncer.Change {
	var out []syncer.Change
	for _, c := range old.Credentials {
		if cur != nil && slices.ContainsFunc(cur.Credentials, func(n syncer.CredentialSummary) bool {
			return n.ManagedServiceAccount == c.ManagedServiceAccount
		}) {
			continue
		}
		out = append(out, syncer.Change{
			Type: syncer.ChangeCredentialRemoved, Namespace: old.Namespace, Cluster: old.Cluster,
			Name: c.Secret, ResourceVersion: c.ResourceVersion, Time: now, Credential: &c,
		})
	}
	if old.Profile != nil && (cur == nil || cur.Profile == nil) {
		out = append(out, syncer.Change{
			Type: syncer.ChangeProfileDeleted, Namespace: old.Namespace, Cluster: old.Cluster,
			Name: old.Cluster, ResourceVersion: old.profileRV, Time: now, Profile: old.Profile,
		})
	}
	return out
}

func (r *Record) put(key string) kvOp {
	v := *r
	if v.Credentials == nil {
		v.Credentials = []syncer.CredentialSummary{}
	}
	data, err := json.Marshal(v)
	if err != nil {
		// Only plain strings, maps and times: cannot happen.
		panic(err)
	}
	return kvOp{key: key, value: data}
}

func setCredential(list []syncer.CredentialSummary, c syncer.CredentialSummary) []syncer.CredentialSummary {
	i := sort.Search(len(list), func(i int) bool { return list[i].ManagedServiceAccount >= c.ManagedServiceAccount })
	if i < len(list) && list[i].ManagedServiceAccount == c.ManagedServiceAccount {
		out := append([]syncer.CredentialSummary(nil), list...)
		out[i] = c
		return out
	}
	out := make([]syncer.CredentialSummary, 0, len(list)+1)
	out = append(out, list[:i]...)
	out = append(out, c)
	return append(out, list[i:]...)
}

func removeCredential(list []syncer.CredentialSummary, msa string) []syncer.CredentialSummary {
	out := make([]syncer.CredentialSummary, 0, len(list))
	for _, c := range list {
		if c.ManagedServiceAccount != msa {
			out = append(out, c)
		}
	}
	return out
}
