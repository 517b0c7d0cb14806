package config

import (
	"encoding/base32"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var (
	subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	consumerName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// isPublicUserNKey reports whether k is a public user NKey: base32 of the
// user prefix byte, a 32-byte Ed25519 key and the CRC-16 (XMODEM) of both,
// as github.com/nats-io/nkeys encodes it. Checked here without that
// module, which only the bus and the CLI link.
func isPublicUserNKey(k string) bool {
	const userPrefix = 20 << 3 // 'U'
	if len(k) != 56 || k[0] != 'U' {
		return false
	}
	raw, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(k)
	if err != nil || len(raw) != 35 || raw[0] != userPrefix {
		return false
	}
	var crc uint16
	for _, b := range raw[:33] {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc == uint16(raw[33])|uint16(raw[34])<<8
}

// ValidConsumerName reports whether name may name an application of
// bus.consumers: a NATS subject token and account name, readable in logs.
func ValidConsumerName(name string) bool { return consumerName.MatchString(name) }

// validateBusConsumers checks the consuming applications: unique names,
// public user NKeys (never a seed: it would be a secret in the file), and
// namespaces.
func validateBusConsumers(path *field.Path, cs []BusConsumer) field.ErrorList {
	var errs field.ErrorList
	names, keys := map[string]bool{}, map[string]string{}
	for i, c := range cs {
		p := path.Index(i)
		switch {
		case !ValidConsumerName(c.Name):
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, "must be 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit"))
		case c.Name == LocalConsumer:
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, "is the embedded server's consumer without credentials; choose another name"))
		case names[c.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
		}
		names[c.Name] = true
		if len(c.NKeys) == 0 {
			errs = append(errs, field.Required(p.Child("nkeys"), "a consumer signs in with an NKey: list its public key (U...)"))
		}
		for j, k := range c.NKeys {
			kp := p.Child("nkeys").Index(j)
			switch {
			case strings.HasPrefix(k, "S"):
				// Never echo it: a seed is a secret.
				errs = append(errs, field.Invalid(kp, "<not shown>", "is a seed, which is secret and stays with the application; list its public key (U...), as hubsync nkey prints"))
			case !isPublicUserNKey(k):
				errs = append(errs, field.Invalid(kp, k, "is not a public user NKey (U...)"))
			case keys[k] != "":
				errs = append(errs, field.Invalid(kp, k, fmt.Sprintf("is also a key of consumer %q: one key signs in to one account", keys[k])))
			default:
				keys[k] = c.Name
			}
		}
		for j, ns := range c.Namespaces {
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, field.Invalid(p.Child("namespaces").Index(j), ns, msg))
			}
		}
	}
	return errs
}

func (c *Config) validateBus() field.ErrorList {
	b := c.Bus
	path := field.NewPath("bus")
	errs := validateBusURLs(path, b)
	errs = append(errs, validateBusClient(path, b)...)
	errs = append(errs, validateBusStream(path, b)...)
	errs = append(errs, validateBusConsumers(path.Child("consumers"), b.Consumers)...)
	if len(b.URLs) > 0 && len(b.Consumers) > 0 && b.NKeySeedFile == "" {
		errs = append(errs, field.Required(path.Child("nkeySeedFile"), "bus.consumers on an external NATS: hubsync signs in to each application's account with an NKey derived from this seed (hubsync bus-accounts prints the accounts)"))
	}
	if len(b.URLs) == 0 {
		errs = append(errs, validateEmbedded(path.Child("embedded"), b.Embedded)...)
	} else if b.Embedded.TLS != (BusEmbeddedTLS{}) || b.Embedded.AuthTokenFile != "" {
		errs = append(errs, field.Forbidden(path.Child("embedded"), "tls and authTokenFile apply to the embedded server, which does not run when bus.urls is set"))
	}
	return errs
}

// validateBusURLs checks the external NATS URLs. A URL may carry a
// password or token, so errors show it redacted.
func validateBusURLs(path *field.Path, b Bus) field.ErrorList {
	var errs field.ErrorList
	for i, u := range b.URLs {
		p, err := url.Parse(u)
		switch {
		case err != nil:
			// url's errors quote the URL, credentials included.
			errs = append(errs, field.Invalid(path.Child("urls").Index(i), "<not shown>", "is not a URL"))
		case p.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, p.Scheme):
			errs = append(errs, field.Invalid(path.Child("urls").Index(i), RedactURL(u), "must be nats://, tls://, ws:// or wss:// host:port"))
		case b.RequireTLS && p.Scheme == "ws":
			errs = append(errs, field.Invalid(path.Child("urls").Index(i), RedactURL(u), "requireTLS: ws:// cannot carry TLS; use wss://"))
		}
	}
	return errs
}

// validateBusClient checks how hubsync authenticates to an external NATS.
func validateBusClient(path *field.Path, b Bus) field.ErrorList {
	var errs field.ErrorList
	if b.CredsFile != "" && b.NKeySeedFile != "" {
		errs = append(errs, field.Forbidden(path, "credsFile and nkeySeedFile are mutually exclusive"))
	}
	errs = append(errs, together(path.Child("tls"), b.TLS.CertFile, b.TLS.KeyFile)...)
	if len(b.URLs) == 0 && (b.CredsFile != "" || b.NKeySeedFile != "" || b.TLS != (BusTLS{}) || b.RequireTLS) {
		errs = append(errs, field.Forbidden(path, "credsFile, nkeySeedFile, tls and requireTLS apply to an external NATS: set bus.urls"))
	}
	return errs
}

// validateBusStream checks the names and bounds of what the bus keeps:
// subjects, the stream, the KV bucket and the queue of events waiting.
func validateBusStream(path *field.Path, b Bus) field.ErrorList {
	var errs field.ErrorList
	for _, prefix := range strings.Split(b.SubjectPrefix, ".") {
		if !subjectToken.MatchString(prefix) {
			errs = append(errs, field.Invalid(path.Child("subjectPrefix"), b.SubjectPrefix, "must be dot-separated tokens of letters, digits, - and _"))
			break
		}
	}
	if !subjectToken.MatchString(b.Stream.Name) {
		errs = append(errs, field.Invalid(path.Child("stream", "name"), b.Stream.Name, "must be letters, digits, - and _"))
	}
	if !subjectToken.MatchString(b.KVBucket) {
		errs = append(errs, field.Invalid(path.Child("kvBucket"), b.KVBucket, "must be letters, digits, - and _"))
	}
	if b.Stream.MaxBytes < 0 {
		errs = append(errs, field.Invalid(path.Child("stream", "maxBytes"), b.Stream.MaxBytes, "must not be negative (0 is unlimited)"))
	}
	errs = append(errs, between(path.Child("stream", "replicas"), b.Stream.Replicas, 1, MaxStreamReplicas)...)
	if b.Stream.DuplicateWindow.Duration < 0 || b.Stream.MaxAge.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("stream"), "", "durations must not be negative"))
	}
	if b.BufferSize < 0 {
		errs = append(errs, field.Invalid(path.Child("bufferSize"), b.BufferSize, "must not be negative"))
	}
	if w := b.BatchWindow; w != nil && (w.Duration < 0 || w.Duration > MaxBatchWindow) {
		errs = append(errs, field.Invalid(path.Child("batchWindow"), w.Duration.String(), fmt.Sprintf("must be 0 to %s", MaxBatchWindow)))
	}
	if y := b.YieldMax; y != nil && (y.Duration < 0 || y.Duration > MaxBusYieldMax) {
		errs = append(errs, field.Invalid(path.Child("yieldMax"), y.Duration.String(), fmt.Sprintf("must be 0 (never hold events) to %s", MaxBusYieldMax)))
	}
	return errs
}

// validateEmbedded checks the embedded server, which serves every event to
// whoever reaches its listener.
func validateEmbedded(ep *field.Path, e BusEmbedded) field.ErrorList {
	var errs field.ErrorList
	if err := validateHostPort(e.Listen); err != nil {
		errs = append(errs, field.Invalid(ep.Child("listen"), e.Listen, err.Error()))
	} else if !IsLoopback(e.Listen) && e.TLS.CertFile == "" {
		// Off loopback a client signs in (a consumer's NKey, a client
		// certificate or the token; anyone else is refused), and nothing
		// it sends or reads may cross the network in clear text.
		errs = append(errs, field.Forbidden(ep.Child("listen"), fmt.Sprintf(
			"%q is not a loopback address: consumers' keys, events and records would cross the network in clear text; "+
				"set bus.embedded.tls (certFile, keyFile), or listen on 127.0.0.1", e.Listen)))
	}
	errs = append(errs, together(ep.Child("tls"), e.TLS.CertFile, e.TLS.KeyFile)...)
	if e.TLS.ClientCAFile != "" && e.TLS.CertFile == "" {
		errs = append(errs, field.Required(ep.Child("tls", "certFile"), "clientCAFile needs the server's own certFile and keyFile"))
	}
	return append(errs, validateCluster(ep.Child("cluster"), e.Cluster)...)
}

// validateCluster checks the routes between the embedded servers: a name
// turns clustering on, and then routes need an address, peers and mutual
// TLS.
func validateCluster(cp *field.Path, c BusCluster) field.ErrorList {
	var errs field.ErrorList
	if c.Name == "" {
		if c.Listen != "" || len(c.Routes) > 0 || c.TLS != (BusClusterTLS{}) || c.ServerName != "" {
			errs = append(errs, field.Required(cp.Child("name"), "the cluster's name turns clustering on; the other cluster fields need it"))
		}
		return errs
	}
	if !subjectToken.MatchString(c.Name) {
		errs = append(errs, field.Invalid(cp.Child("name"), c.Name, "must be letters, digits, - and _"))
	}
	if err := validateHostPort(c.Listen); err != nil {
		errs = append(errs, field.Invalid(cp.Child("listen"), c.Listen, err.Error()))
	}
	if len(c.Routes) == 0 {
		errs = append(errs, field.Required(cp.Child("routes"), "the nodes' route URLs (nats://host:port)"))
	}
	for i, r := range c.Routes {
		if u, err := url.Parse(r); err != nil || u.Scheme != "nats" || u.Host == "" || u.User != nil {
			errs = append(errs, field.Invalid(cp.Child("routes").Index(i), RedactURL(r), "must be nats://host:port, without credentials (routes authenticate with mutual TLS)"))
		}
	}
	if c.TLS.CertFile == "" || c.TLS.KeyFile == "" || c.TLS.CAFile == "" {
		errs = append(errs, field.Required(cp.Child("tls"), "routes carry every event and record: certFile, keyFile and caFile (mutual TLS) are required"))
	}
	return errs
}
