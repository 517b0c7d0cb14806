package bus

import (
	"encoding/json"
	"time"

	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// Record is the KV access record of one (namespace, cluster), stored under
// events.KVKey(namespace, cluster): what a consumer needs to reach the cluster,
// without hub access and without any secret. Its JSON schema is
// events.RecordSchemaURL (schema/record.v1.json).
type Record = stream.Record

// kvOp is one write to the KV bucket: a put of value, or a delete when
// value is nil.
type kvOp struct {
	key   string
	value []byte
}

// kvOpFor applies a change to the records the bus has told consumers of
// and returns the KV write that mirrors it; ok is false when the change
// does not touch the bucket. A profile deletion always deletes the key,
// which may hold a record of an earlier run.
func kvOpFor(rs stream.Records, c stream.Change, now time.Time) (kvOp, bool) {
	r, touched := rs.Apply(c, now)
	key := events.KVKey(c.Namespace, c.Cluster)
	switch {
	case c.Type == stream.ProfileDeleted:
		return kvOp{key: key}, true
	case !touched:
		return kvOp{}, false
	case r == nil:
		return kvOp{key: key}, true
	default:
		return putRecord(key, r), true
	}
}

func putRecord(key string, r *Record) kvOp {
	v := *r
	if v.Credentials == nil {
		v.Credentials = []stream.CredentialSummary{}
	}
	data, err := json.Marshal(v)
	if err != nil {
		// Only plain strings, maps and times: cannot happen.
		panic(err)
	}
	return kvOp{key: key, value: data}
}
