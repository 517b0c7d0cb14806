package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// refusal is the gateway's own answer to a request: the code, the metric
// label, the Kubernetes Status reason and the message the client reads.
// No message quotes a token.
type refusal struct {
	code   int
	why    string
	reason string
	msg    string
	// retryAfter is sent with 429.
	retryAfter time.Duration
	// paid: the refusal was charged to the client's address already.
	paid bool
}

func refuse(code int, why, msg string) *refusal {
	return &refusal{code: code, why: why, reason: statusReason(code), msg: msg}
}

// statusReason is the Kubernetes StatusReason kubectl shows for code.
func statusReason(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "BadRequest"
	case http.StatusUnauthorized:
		return "Unauthorized"
	case http.StatusForbidden:
		return "Forbidden"
	case http.StatusNotFound:
		return "NotFound"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowed"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusInternalServerError:
		return "InternalError"
	default:
		return "ServiceUnavailable"
	}
}

// connectionTokens are the only names a client's Connection header may
// carry. Go's reverse proxy removes every header a Connection header
// names before the gateway sees the outgoing request; real clients
// (kubectl, client-go, browsers' WebSockets) never name anything else, so
// any other name is an attempt to remove a header and is refused.
var connectionTokens = map[string]bool{"keep-alive": true, "close": true, "upgrade": true, "te": true}

// checkConnection refuses a Connection header naming anything but
// keep-alive, close, upgrade or te.
func checkConnection(h http.Header) *refusal {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" || connectionTokens[name] {
				continue
			}
			shown := "another header"
			if len(name) <= 64 && httpguts.ValidHeaderFieldName(name) {
				shown = fmt.Sprintf("%q", name)
			}
			return refuse(http.StatusBadRequest, "connection_header", fmt.Sprintf(
				"the Connection header may name only keep-alive, close, upgrade and te, and it names %s: "+
					"a hop-by-hop list could remove a header the gateway sets", shown))
		}
	}
	return nil
}

// identityHeader reports a header the API server reads an identity from:
// the bearer token, impersonation and request-header (front-proxy)
// authentication. Case does not matter.
func identityHeader(name string) bool {
	return strings.EqualFold(name, "authorization") || strings.EqualFold(name, "proxy-authorization") ||
		hasPrefixFold(name, "impersonate-") || hasPrefixFold(name, "x-remote-") || frontProxyHeader(name)
}

// frontProxyHeaders are the identity headers of common authenticating
// proxies (oauth2-proxy, Apache's and nginx's auth modules), which an API
// server configured with --requestheader-username-headers may read.
var frontProxyHeaders = []string{
	"x-forwarded-user", "x-forwarded-groups", "x-forwarded-email", "x-forwarded-preferred-username", "x-forwarded-access-token",
	"remote-user", "remote-groups", "remote-email", "remote-name",
}

// frontProxyHeader reports one of frontProxyHeaders or X-Auth-Request-*,
// in any case.
func frontProxyHeader(name string) bool {
	for _, h := range frontProxyHeaders {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	return hasPrefixFold(name, "x-auth-request-")
}

// hasPrefixFold is strings.HasPrefix ignoring case, for an ASCII prefix
// (header names are ASCII tokens), without a lower-cased copy.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// protocolTokenPrefix marks a bearer token sent as a WebSocket subprotocol
// (Kubernetes' authenticator for browsers).
const protocolTokenPrefix = "base64url.bearer.authorization.k8s.io."

// screen refuses a request that tries to choose the identity a cluster
// sees, or that carries a credential where the gateway would forward it:
// client-sent Impersonate-* and X-Remote-* headers, a bearer token in a
// WebSocket subprotocol, request trailers, and a token (the request's own,
// or anything shaped like a JWT) in the URL or in any other header.
// token is the request's bearer token.
func screen(r *http.Request, route Route, token string) *refusal {
	for k := range r.Header {
		switch {
		case hasPrefixFold(k, "impersonate-"):
			return refuse(http.StatusForbidden, "impersonation_header",
				"Impersonate-* headers are refused: the gateway sets the identity itself (hub users act as "+Prefix+"<user>)")
		case hasPrefixFold(k, "x-remote-"):
			return refuse(http.StatusForbidden, "request_header_identity",
				"X-Remote-* headers are refused: the gateway sets the identity itself")
		case frontProxyHeader(k):
			return refuse(http.StatusForbidden, "request_header_identity", fmt.Sprintf(
				"the %s header is refused: an authenticating proxy's identity headers are not the client's to send", headerName(k)))
		}
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		if strings.Contains(strings.ToLower(v), protocolTokenPrefix) {
			// The API server takes a bearer token from a WebSocket
			// subprotocol too.
			return refuse(http.StatusUnauthorized, "protocol_token",
				"bearer tokens in Sec-WebSocket-Protocol are refused: send the token in the Authorization header")
		}
	}
	if len(r.Trailer) > 0 {
		return refuse(http.StatusBadRequest, "trailers",
			"request trailers are refused: a header sent after the body could not be checked before it is forwarded")
	}
	forms := newTokenForms(token)
	if where := credentialInURL(r.URL, route, forms); where != "" {
		return refuse(http.StatusBadRequest, "credential_in_url", fmt.Sprintf(
			"the URL carries a credential (%s): the gateway forwards the URL to the cluster, whose audit log would keep it; "+
				"send the token only in the Authorization header", where))
	}
	for k, vs := range r.Header {
		if strings.EqualFold(k, "Authorization") {
			continue
		}
		for _, v := range vs {
			if forms.in(v) || containsJWT(v) {
				return refuse(http.StatusBadRequest, "credential_in_header", fmt.Sprintf(
					"the %s header carries a bearer token: send it only in the Authorization header", headerName(k)))
			}
		}
	}
	return nil
}

// credentialInURL says where the URL carries a credential: a parameter
// named access_token, or the request's token or a JWT in any parameter's
// name or value or in the path. "" when it carries none.
func credentialInURL(u *url.URL, route Route, forms *tokenForms) string {
	if forms.in(route.Path) || forms.in(route.RawPath) || containsJWT(route.Path) {
		return "in the path"
	}
	if u.RawQuery == "" {
		return ""
	}
	if forms.in(u.RawQuery) {
		return "in the query"
	}
	q, _ := url.ParseQuery(u.RawQuery)
	for name, values := range q {
		if strings.EqualFold(name, "access_token") {
			return "the access_token parameter"
		}
		if forms.in(name) || containsJWT(name) {
			return "in a query parameter's name"
		}
		for _, v := range values {
			if forms.in(v) || containsJWT(v) {
				return "in the value of the query parameter " + headerName(name)
			}
		}
	}
	return ""
}

// headerName quotes a client-chosen name for a message when it is short
// and plain.
func headerName(name string) string {
	if len(name) <= 64 && httpguts.ValidHeaderFieldName(name) {
		return fmt.Sprintf("%q", name)
	}
	return "(unnamed)"
}

// minTokenForms is the shortest token looked for elsewhere in a request:
// a shorter one would be found in innocent paths and headers.
const minTokenForms = 8

// tokenForms finds a token as sent or base64-encoded in any alphabet (the
// forms a client would put it in elsewhere). The encodings, each longer
// than the token, are made only for a text long enough to hold them,
// which on the hot path none is.
type tokenForms struct {
	token string
	forms []string
}

func newTokenForms(token string) *tokenForms {
	if len(token) < minTokenForms {
		return &tokenForms{}
	}
	return &tokenForms{token: token}
}

// in reports whether s holds the token in one of its forms.
func (f *tokenForms) in(s string) bool {
	if f.token == "" || len(s) < len(f.token) {
		return false
	}
	if f.forms == nil {
		b := []byte(f.token)
		f.forms = []string{f.token,
			base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
			base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b)}
	}
	for _, form := range f.forms {
		if len(form) <= len(s) && strings.Contains(s, form) {
			return true
		}
	}
	return false
}

// containsJWT reports whether s holds a JSON Web Token anywhere (three
// base64url segments joined by dots, the first a JOSE header with "alg"),
// plainly or base64-encoded once, in either alphabet and wherever it
// starts: a wrapped token need not start on the 4-character grid of the
// text around it.
func containsJWT(s string) bool {
	if scanRuns(s, isJWTByte, hasJWT) {
		return true
	}
	for _, a := range wrappings {
		if scanRuns(s, a.in, func(run string) bool { return wrappedJWT(run, a.enc) }) {
			return true
		}
	}
	return false
}

// wrappings are the base64 alphabets a token may be wrapped in, each
// with the bytes it is written in: a run of one ends where the other's
// bytes begin (a base64url token in a path stands apart from its '/').
var wrappings = []struct {
	in  func(byte) bool
	enc *base64.Encoding
}{
	{func(c byte) bool { return isAlnum(c) || c == '+' || c == '/' }, base64.RawStdEncoding},
	{func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' }, base64.RawURLEncoding},
}

// minWrapped is the shortest run that may hold a base64-wrapped JWT.
const minWrapped = 40

// wrappedJWT decodes run from each of the four places on the base64 grid
// (whole quanta only) and looks for a JWT in what it decodes to. A run in
// neither alphabet's shape, such as /api/v1/namespaces/kube-system,
// decodes to bytes that hold none.
func wrappedJWT(run string, enc *base64.Encoding) bool {
	if len(run) < minWrapped {
		return false
	}
	for off := range 4 {
		part := run[off:]
		part = part[:len(part)-len(part)%4]
		if dec, err := enc.DecodeString(part); err == nil && scanRuns(string(dec), isJWTByte, hasJWT) {
			return true
		}
	}
	return false
}

// scanRuns calls f on each maximal run of bytes in s that in accepts,
// until f returns true.
func scanRuns(s string, in func(byte) bool, f func(string) bool) bool {
	start := -1
	for i := 0; i <= len(s); i++ {
		if i < len(s) && in(s[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 && f(s[start:i]) {
			return true
		}
		start = -1
	}
	return false
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isJWTByte: the base64url alphabet and the dot.
func isJWTByte(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' }

// hasJWT reports a JOSE header segment followed by two more segments in a
// dot-separated run.
func hasJWT(run string) bool {
	if strings.Count(run, ".") < 2 {
		return false
	}
	parts := strings.Split(run, ".")
	for i := 0; i+2 < len(parts); i++ {
		if parts[i+1] == "" {
			continue
		}
		// The header may follow bytes of the text around it ("x=eyJ…",
		// or a decoded wrapping's misaligned start) in the same run.
		for skip := 0; skip <= maxHeaderSkip && skip < len(parts[i]); skip++ {
			if isJOSEHeader(parts[i][skip:]) {
				return true
			}
		}
	}
	return false
}

// maxHeaderSkip bounds the bytes before a JOSE header that hasJWT looks
// past.
const maxHeaderSkip = 12

func isJOSEHeader(seg string) bool {
	if len(seg) < 8 {
		return false
	}
	dec, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(seg, "="))
	if err != nil {
		return false
	}
	var h map[string]json.RawMessage
	if json.Unmarshal(dec, &h) != nil {
		return false
	}
	_, ok := h["alg"]
	return ok
}
