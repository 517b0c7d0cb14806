package gateway

import (
	"errors"
	"net/http"
	"strings"
)

// Prefix starts every name a hub identity is impersonated as on a managed
// cluster: a hub user alice acts there as cluster:hub:alice, and a hub
// group system:masters as cluster:hub:system:masters, never as itself.
const Prefix = "cluster:hub:"

// Identity is a hub user as the hub's TokenReview reports it.
type Identity struct {
	Username string
	UID      string
	Groups   []string
	Extra    map[string][]string
}

// Errors of BearerToken.
var (
	ErrNoToken        = errors.New("no bearer token: the gateway serves no anonymous requests")
	ErrTwoAuthHeaders = errors.New("more than one Authorization header")
	ErrNotBearer      = errors.New("the Authorization header is not a bearer token")
)

// BearerToken returns the request's bearer token: exactly one
// Authorization header, "Bearer <token>", the token one non-empty word.
// Errors never quote the header.
func BearerToken(h http.Header) (string, error) {
	values := h.Values("Authorization")
	switch len(values) {
	case 0:
		return "", ErrNoToken
	case 1:
	default:
		return "", ErrTwoAuthHeaders
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", ErrNotBearer
	}
	if token == "" || strings.ContainsAny(token, " \t\r\n,") {
		return "", ErrNotBearer
	}
	return token, nil
}

// HasImpersonation reports whether a client sent any Impersonate-*
// header (Impersonate-User, -Group, -Uid, -Extra-*), in any spelling.
func HasImpersonation(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "impersonate-") {
			return true
		}
	}
	return false
}

// Impersonate rewrites the outgoing request's headers for a hub identity:
// the client's Authorization and every Impersonate-* header are removed,
// and the identity is set with every name prefixed. The uid and extra
// fields are not forwarded: a hub uid means nothing on a managed cluster,
// and RBAC cannot limit impersonating them to prefixed values (it matches
// resourceNames exactly), so granting it would grant every uid.
func Impersonate(h http.Header, id Identity) error {
	if id.Username == "" {
		return errors.New("the hub identity has no username")
	}
	h.Del("Authorization")
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "impersonate-") {
			delete(h, k)
		}
	}
	h.Set("Impersonate-User", Prefix+id.Username)
	for _, g := range id.Groups {
		if g == "" {
			continue
		}
		h.Add("Impersonate-Group", Prefix+g)
	}
	return nil
}

// ImpersonatedUser is the name id has on a managed cluster, for RBAC and
// logs.
func ImpersonatedUser(id Identity) string { return Prefix + id.Username }
