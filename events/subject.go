package events

import (
	"fmt"
	"strings"
)

// Subject returns the subject of an event: <prefix>.<namespace>.<cluster>.<kind>,
// with namespace, cluster and kind escaped by EscapeToken so that a '.' (or
// a wildcard) in a Kubernetes name cannot change the subject's hierarchy.
// The prefix is used as given: it may hold several tokens ("acme.hubsync").
func Subject(prefix, namespace, cluster, kind string) string {
	return prefix + "." + EscapeToken(namespace) + "." + EscapeToken(cluster) + "." + EscapeToken(kind)
}

// EscapeToken makes s safe as one NATS subject token. Bytes in
// [A-Za-z0-9_-] are kept; every other byte of s's UTF-8 encoding ('.', '*',
// '>', '%', whitespace, non-ASCII, ...) becomes '%' and two uppercase hex
// digits, as in URL percent-encoding: EscapeToken("a.b") == "a%2Eb".
// Kubernetes namespace names never need escaping; cluster names with dots do.
// The escaping is a public contract: consumers that build subjects for a
// given namespace or cluster must apply it too.
func EscapeToken(s string) string { return escape(s, '%') }

// UnescapeToken reverses EscapeToken. It rejects a token that EscapeToken
// cannot have produced (a bad or lowercase escape, or a byte that should
// have been escaped), so every token has exactly one meaning.
func UnescapeToken(s string) (string, error) { return unescape(s, '%') }

// KVKey is the key-value bucket key of the access record of (namespace,
// cluster): "<namespace>.<cluster>", each part escaped like EscapeToken but
// with '=' instead of '%' as the escape character, because JetStream KV
// keys may only hold [-/_=.A-Za-z0-9]. For example KVKey("team-a", "c1.eu")
// == "team-a.c1=2Eeu". ParseKVKey reverses it.
func KVKey(namespace, cluster string) string {
	return escape(namespace, '=') + "." + escape(cluster, '=')
}

// ParseKVKey splits a key made by KVKey into namespace and cluster.
func ParseKVKey(key string) (namespace, cluster string, err error) {
	ns, cl, ok := strings.Cut(key, ".")
	if !ok || strings.Contains(cl, ".") {
		return "", "", fmt.Errorf("KV key %q is not <namespace>.<cluster>", key)
	}
	if namespace, err = unescape(ns, '='); err != nil {
		return "", "", err
	}
	if cluster, err = unescape(cl, '='); err != nil {
		return "", "", err
	}
	return namespace, cluster, nil
}

const upperHex = "0123456789ABCDEF"

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func escape(s string, mark byte) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte(mark)
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xF])
	}
	return b.String()
}

func unescape(s string, mark byte) (string, error) {
	if !strings.ContainsRune(s, rune(mark)) {
		for i := 0; i < len(s); i++ {
			if !plain(s[i]) {
				return "", fmt.Errorf("token %q: byte %q must be escaped", s, s[i])
			}
		}
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case plain(c):
			b.WriteByte(c)
		case c == mark:
			if i+2 >= len(s) {
				return "", fmt.Errorf("token %q: truncated escape at offset %d", s, i)
			}
			hi, lo := strings.IndexByte(upperHex, s[i+1]), strings.IndexByte(upperHex, s[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("token %q: bad escape %q at offset %d (want %c and two uppercase hex digits)", s, s[i:i+3], i, mark)
			}
			d := byte(hi<<4 | lo)
			if plain(d) {
				return "", fmt.Errorf("token %q: %q escapes %q, which is never escaped", s, s[i:i+3], d)
			}
			b.WriteByte(d)
			i += 2
		default:
			return "", fmt.Errorf("token %q: byte %q must be escaped", s, c)
		}
	}
	return b.String(), nil
}
