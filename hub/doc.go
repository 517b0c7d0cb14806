// Package hub is the naming contract of the hub objects hubsync reads and
// writes: label and annotation keys, the names of credential copies, the
// synced-from label value, the data keys of token Secrets, the token
// fingerprint, a JWT's expiry and the exec extension key.
//
// It is a leaf: the syncer that writes these objects and every consumer that
// reads them (sinks, tunnel, gateway, the CLI) import it, so a rule is
// written once and cannot drift between the two sides. It may import only
// the standard library, apimachinery and the upstream API types; it imports
// no other hubsync package.
package hub
