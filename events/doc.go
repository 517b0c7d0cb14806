// Package events is hubsync's event contract, independent of any transport:
// the CloudEvents 1.0 envelope of a change, its type names, deterministic ids
// (also the JetStream de-duplication id), the NATS subject and KV key layout
// with escaping, and the JSON schemas of events and access records.
//
// The NATS bus, the webhook sink and the CLI all encode and decode through
// it, so they cannot drift apart. It may import only stream and hub (and
// no transport: no NATS, no client-go); TestImportRules enforces that.
package events
