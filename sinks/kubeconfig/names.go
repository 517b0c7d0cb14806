package kubeconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// suffix ends every file name the sink writes.
	suffix = ".kubeconfig"
	// maxFileName bounds the names the sink writes. NAME_MAX is 255 bytes,
	// but sinks.WriteFileAtomic first creates "." + name + ".tmp-" plus up
	// to ten random digits in the same directory, so the final name must
	// leave 16 bytes for that temporary name to be valid as well.
	maxFileName = 255 - len(".") - len(".tmp-") - 10
	// hashLen is the number of hex digits of the SHA-256 of the untruncated
	// base name kept in a truncated name: 128 bits, so that two keys
	// sharing a long prefix cannot collide in practice.
	hashLen = 32
)

// ownName matches every name FileName returns: a DNS label, one
// underscore, a DNS subdomain (or, truncated, its first bytes, which may
// end in a dot or dash), then, for a truncated name only, a second
// underscore and the hash. ownTemp matches WriteFileAtomic's temporary
// files of such names.
var (
	ownName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?_[a-z0-9][-a-z0-9.]*(_[0-9a-f]{32})?\.kubeconfig$`)
	ownTemp = regexp.MustCompile(`^\.(.+)\.tmp-[0-9]+$`)
)

// FileName returns the name of the kubeconfig file of cluster in consumer
// namespace: "<namespace>_<cluster>.kubeconfig". Neither a namespace (a
// DNS-1123 label) nor a cluster name (a DNS-1123 subdomain) can contain an
// underscore, so the single underscore splits the name unambiguously even
// though cluster names contain dots and dashes.
//
// A name longer than maxFileName bytes (a long namespace with a long
// cluster name) keeps the first bytes of "<namespace>_<cluster>", then
// "_" and 32 hex digits of the SHA-256 of the whole "<namespace>_<cluster>",
// then ".kubeconfig". The namespace, at most 63 bytes, always survives the
// cut, and the second underscore tells a truncated name from a full one, so
// the two kinds never collide.
func FileName(namespace, cluster string) string {
	base := namespace + "_" + cluster
	if len(base)+len(suffix) <= maxFileName {
		return base + suffix
	}
	sum := sha256.Sum256([]byte(base))
	keep := maxFileName - len(suffix) - 1 - hashLen
	return base[:keep] + "_" + hex.EncodeToString(sum[:])[:hashLen] + suffix
}

// isOwnName reports whether name has the shape of the names FileName
// returns.
func isOwnName(name string) bool {
	return len(name) <= maxFileName && ownName.MatchString(name)
}

// isOwnTemp reports whether name is a temporary file WriteFileAtomic made
// for one of the sink's names.
func isOwnTemp(name string) bool {
	m := ownTemp.FindStringSubmatch(name)
	return m != nil && isOwnName(m[1])
}

// validKey checks the names a file name is made of: they come from the
// hub's objects, but a name that is not a DNS label and subdomain could
// escape the directory or break the scheme's uniqueness.
func validKey(namespace, cluster string) error {
	if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
		return fmt.Errorf("namespace %q: %v", namespace, msgs)
	}
	if msgs := validation.IsDNS1123Subdomain(cluster); len(msgs) > 0 {
		return fmt.Errorf("cluster %q: %v", cluster, msgs)
	}
	return nil
}
