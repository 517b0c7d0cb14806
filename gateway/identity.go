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
// Authorization header (in any spelling), "Bearer <token>", the token one
// non-empty word. Errors never quote the header.
func BearerToken(h http.Header) (string, error) {
	var values []string
	for k, vs := range h {
		if strings.EqualFold(k, "Authorization") {
			values = append(values, vs...)
		}
	}
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

// ImpersonatedUser is the name id has on a managed cluster, for RBAC and
// logs.
func ImpersonatedUser(id Identity) string { return Prefix + id.Username }
