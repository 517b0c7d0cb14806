// Package webhook is the sink that POSTs every hubsync event to an HTTPS
// endpoint, signed per Standard Webhooks 1.0 (see CONTRACTS.md section 8).
//
// # What is sent
//
// The body of each request is exactly the CloudEvent hubsync publishes on
// NATS (events.Encode), in the CloudEvents HTTP binding's structured mode
// (Content-Type: application/cloudevents+json), so every attribute is under
// the signature. The headers webhook-id (the event id, the same on every
// attempt and every republication of the change), webhook-timestamp (unix
// seconds of the attempt) and webhook-signature (v1,<base64 HMAC-SHA256 of
// "{id}.{timestamp}.{body}">, one per configured secret, space-separated)
// let the receiver authenticate the event and drop duplicates: delivery is
// at least once, and a receiver must dedupe by webhook-id.
//
// # Delivery
//
// Deliver does not talk to the endpoint. It appends the encoded events to
// an on-disk spool and returns; a sender goroutine posts the spooled
// events and removes each from the spool only after a 2xx. It has up to
// webhook.concurrency requests in flight (default 16), so that an
// endpoint far away is not held to one round trip per event, but the
// events of one (namespace, cluster) go one at a time, in spool order: an
// event is sent only once every earlier event of its key is delivered.
// The sender looks ahead at a window of the spool (16 events per request
// in flight, from the first event not delivered yet) for events of keys
// that are not busy, so a slow key holds the others back only once the
// window is full. It retries with its own loop: exponential backoff with
// jitter for network errors, 3xx (never followed), 4xx and 5xx, and at
// least the Retry-After of a 429 or 503. A failed attempt holds every
// key: the sender then probes, one attempt at a time after the backoff or
// the Retry-After, until one succeeds, so an endpoint that is down or
// throttling gets what a single sender would send it. The CloudEvents
// SDK's HTTP retry is not used: it ignores Retry-After, has no jitter
// (many hubs behind one outage would retry in lock step) and does not
// retry a 500. A 410 Gone disables the sink until it is recreated (for
// example on a configuration reload): events are then dropped. The delays
// are apimachinery's wait.Backoff (200ms doubling up to 30s) with half of
// each step random; classify holds the whole policy, one verdict per answer.
// The HTTP client keeps a connection per request in flight open, so a
// far endpoint is not paid a TLS handshake per request.
//
// # Health
//
// Since Deliver only spools, the fan-out sees every delivery succeed: the
// sink reports its own status instead (stream.Reporter), from the spool
// and from the record of the sender's attempts. Its backlog counts as
// queued (hubsync_sink_queue_depth), its oldest event's spool time is the
// oldest waiting, and once the endpoint has refused every attempt (any
// answer but 2xx, or none) for failingAfter (default 1m) the sink is
// failing (hubsync_sink_up 0, /readyz?verbose) until an attempt succeeds;
// a 410 makes it failing at once.
//
// # Spool
//
// The spool is a directory (0700, files 0600) of segment files named by a
// 20-digit sequence number, so that listing the directory gives their
// order, each holding events as JSON lines {id, type, namespace, cluster,
// spooled, body}. Each Deliver or Resync appends its batch to the open tail
// segment with one write; a new segment starts past 1 MiB, and the tail is
// closed once the spool has been idle for a second, so that it can be
// removed. Creating a file per batch cost far more than appending. Appends
// are not fsynced: a crash or restart of hubsync loses nothing (the kernel
// has the pages), and a crash of the machine loses at most what the kernel
// had not written back; a last line cut short is dropped, reported, and
// the endpoint resynced once the spool has drained. That is the trade
// JetStream (sync_interval 2m) and Kafka make by default; a file and an
// fsync per batch competed with the API server's etcd for the disk. The
// events of recent segments (up to 8 MiB) are also kept in memory, so the
// sender posts them without reading them back; older ones are read from
// their files, and such a segment takes no appends. A small cursor file,
// rewritten in place at most every 100 ms while events are sent (and
// within a second once the spool is idle, and on Close), says how far the
// spool has been sent: the first event not delivered yet (segment, index)
// and the events beyond it delivered already, which acknowledgements out
// of order across keys leave (at most the window). An event stays in the
// spool until every event before it is delivered too, so one delivered
// ahead of an earlier one never takes the earlier one with it. After a
// restart the remaining events are sent first, in order per key; a crash
// repeats at most the events of the last moments, with the same ids (a
// clean stop repeats none).
//
// The spool is bounded by its maxBytes. An append that would exceed it is
// dropped whole and counted (hubsync_webhook_spool_dropped_total), and so
// is every later one until the spool has drained: then the sink asks the
// fan-out for a resync, which brings the endpoint to the current state. A
// resync that fits, or any resync into an empty spool, ends such an
// episode at once, since it stands for everything dropped before it.
//
// # Resync
//
// The sink keeps what it has told the endpoint (stream.Records, saved as
// told.json in the spool directory next to the segments and rebuilt from
// them after a crash). Resync spools the whole snapshot (its events carry
// stable ids, so the receiver dedupes), then a credential.removed or
// profile.deleted for everything the endpoint was told of that the
// snapshot no longer has. told.json is rewritten (atomically) at most every
// 5 seconds and on Close, not with every batch: with thousands of clusters
// that rewrite dominated the sink's cost. It never misses an event the
// endpoint may have received, because a delivered segment stays on disk
// until a save of told.json covers it, and opening the spool replays every
// segment still on disk into the told records.
//
// # Secrets
//
// Signing secrets (whsec_<base64>, several for rotation) come from a file
// or from a key of a hub Secret, and the bearer token from a file; each is
// read again every few seconds and after every failed attempt, not for
// every event. They and the bearer token never appear in logs or errors.
//
// # Imports
//
// May import sinks, config, stream, hub and events (the event contract, not
// the NATS transport); never syncer or bus.
package webhook
