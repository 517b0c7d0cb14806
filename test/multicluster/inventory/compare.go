package inventory

import (
	"bytes"
	"net/http"
	"net/url"
	"reflect"

	"k8s.io/client-go/rest"
)

// UpstreamSameConfig is upstream's comparison of an engaged cluster's
// config with a new one: reflect.DeepEqual, which finds two non-nil funcs
// different even when they are the same func, so that configs built by
// BuildConfigFromCP (which always sets Proxy) never compare equal.
func UpstreamSameConfig(engaged, built *rest.Config) bool {
	return reflect.DeepEqual(engaged, built)
}

// SameConfigIgnoringFuncs compares two configs with their func fields set
// aside; the proxy is compared by what it does, the URL it picks for a
// request to the server, so a change of the profile's proxy-url still
// counts.
func SameConfigIgnoringFuncs(a, b *rest.Config) bool {
	if a == nil || b == nil {
		return a == b
	}
	pa, errA := proxyFor(a)
	pb, errB := proxyFor(b)
	if pa != pb || (errA == nil) != (errB == nil) {
		return false
	}
	return reflect.DeepEqual(withoutFuncs(a), withoutFuncs(b))
}

// AccessChanged reports whether two configs name another server or CA.
func AccessChanged(a, b *rest.Config) bool {
	if a == nil || b == nil {
		return a != b
	}
	return a.Host != b.Host || !bytes.Equal(a.CAData, b.CAData)
}

// withoutFuncs returns a copy of c whose top-level func fields are nil.
func withoutFuncs(c *rest.Config) *rest.Config {
	out := rest.CopyConfig(c)
	v := reflect.ValueOf(out).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Func && f.CanSet() {
			f.Set(reflect.Zero(f.Type()))
		}
	}
	return out
}

// proxyFor returns the proxy URL c's Proxy picks for a request to its
// server, "" for none.
func proxyFor(c *rest.Config) (string, error) {
	if c.Proxy == nil {
		return "", nil
	}
	host, err := url.Parse(c.Host)
	if err != nil {
		return "", err
	}
	u, err := c.Proxy(&http.Request{URL: host})
	if err != nil || u == nil {
		return "", err
	}
	return u.String(), nil
}
