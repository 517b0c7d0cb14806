package leak

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// base64Run matches text that may be base64 (standard or URL alphabet) long
// enough to hold a token.
var base64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{24,}={0,2}`)

// Tokens reports every way in which text reveals one of tokens: the token
// itself, base64-encoded (any alphabet, padded or not), JSON-escaped, the
// signature of a JWT alone, or any of these inside a base64 run of text
// (a Secret's data, a kubeconfig embedded in JSON). Each finding names the
// token by its index and the form, never the token. Empty tokens are
// ignored.
func Tokens(text string, tokens []string) []string {
	var found []string
	seen := map[string]bool{}
	note := func(s string) {
		if !seen[s] {
			seen[s] = true
			found = append(found, s)
		}
	}
	search := func(text, where string) {
		for i, tok := range tokens {
			for form, v := range forms(tok) {
				if strings.Contains(text, v) {
					note(fmt.Sprintf("token %d (%s%s)", i, form, where))
				}
			}
		}
	}
	search(text, "")
	for _, run := range base64Run.FindAllString(text, -1) {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(run); err == nil {
				search(string(b), ", inside base64")
				break
			}
		}
	}
	return found
}

// forms are the encodings of a token looked for.
func forms(tok string) map[string]string {
	out := map[string]string{}
	if strings.TrimSpace(tok) == "" {
		return out
	}
	out["plain"] = tok
	for name, enc := range map[string]*base64.Encoding{
		"base64": base64.StdEncoding, "base64 unpadded": base64.RawStdEncoding,
		"base64url": base64.URLEncoding, "base64url unpadded": base64.RawURLEncoding,
	} {
		out[name] = enc.EncodeToString([]byte(tok))
	}
	if js, err := json.Marshal(tok); err == nil && string(js[1:len(js)-1]) != tok {
		out["JSON-escaped"] = string(js[1 : len(js)-1])
	}
	// A JWT's header and claims are no secret, its signature is: on its
	// own it still proves the token was there.
	if parts := strings.Split(tok, "."); len(parts) == 3 && len(parts[2]) >= 16 {
		out["JWT signature"] = parts[2]
	}
	return out
}
