package gateway

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/hubsync/hubsync/config"
)

// OptionsFor returns the gateway's options for a defaulted configuration's
// gateway section, with the tunables the file does not expose: everything
// but the dependencies (Pool, Reviewer, HubKeys, Serving, Now, Log,
// Registerer).
func OptionsFor(c config.Gateway) Options {
	var trusted []netip.Prefix
	for _, cidr := range c.ClientAddress.TrustedProxies {
		if p, err := netip.ParsePrefix(cidr); err == nil { // validated
			trusted = append(trusted, p.Masked())
		}
	}
	return Options{
		ClientHeader: c.ClientAddress.Header, TrustedProxies: trusted,
		ReviewCacheTTL: c.ReviewCacheTTL.Duration, ReviewCacheSize: c.ReviewCacheSize,
		MaxInFlightReviews: c.MaxInFlightReviews, RefusalCacheTTL: c.RefusalCacheTTL.Duration,
		RefusalsPerSecond: c.RefusalsPerSecond, RefusalBurst: c.RefusalBurst,
		PassThrough: c.PassThrough == config.PassThroughJWT, HubIssuers: c.HubIssuers, ForwardGroups: c.ForwardGroups,
		KeyRefresh: config.DefaultGatewayKeyRefresh, KeyMinRefetch: config.DefaultGatewayKeyMinRefetch,
		BodyTimeout: c.BodyTimeout.Duration, RetryAfter: config.DefaultGatewayRetryAfter, TunnelWait: c.TunnelWait.Duration,
	}
}

// ServerOptionsFor returns the HTTPS server's options for a defaulted
// configuration's gateway section: everything but Certs and Log.
func ServerOptionsFor(c config.Gateway) ServerOptions {
	return ServerOptions{
		MaxHeaderBytes: c.MaxHeaderBytes, ReadHeaderTimeout: c.ReadHeaderTimeout.Duration, IdleTimeout: c.IdleTimeout.Duration,
		DrainTimeout: c.Drain.Timeout.Duration,
	}
}

// check refuses options left unset: the defaults are config's, and a zero
// here would mean a cache of nothing, no bound on the hub's TokenReviews
// or a body read without a deadline.
func (o *Options) check() error {
	return missing("gateway", []requirement{
		{"ReviewCacheTTL", o.ReviewCacheTTL > 0},
		{"ReviewCacheSize", o.ReviewCacheSize > 0},
		{"MaxInFlightReviews", o.MaxInFlightReviews > 0},
		{"RefusalCacheTTL", o.RefusalCacheTTL > 0},
		{"RefusalsPerSecond", o.RefusalsPerSecond > 0},
		{"RefusalBurst", o.RefusalBurst > 0},
		{"KeyRefresh", o.KeyRefresh > 0},
		{"KeyMinRefetch", o.KeyMinRefetch > 0},
		{"BodyTimeout", o.BodyTimeout > 0},
		{"RetryAfter", o.RetryAfter > 0},
		{"TunnelWait", o.TunnelWait > 0},
	})
}

// check refuses server options left unset: zero would mean Go's own
// limits, none of which bounds a slow client, or a drain that cuts every
// request in flight.
func (o *ServerOptions) check() error {
	return missing("gateway server", []requirement{
		{"MaxHeaderBytes", o.MaxHeaderBytes > 0},
		{"ReadHeaderTimeout", o.ReadHeaderTimeout > 0},
		{"IdleTimeout", o.IdleTimeout > 0},
		{"DrainTimeout", o.DrainTimeout > 0},
	})
}

// requirement is an option and whether it is set.
type requirement struct {
	name string
	ok   bool
}

// missing names the options not set, or returns nil.
func missing(what string, rs []requirement) error {
	var names []string
	for _, r := range rs {
		if !r.ok {
			names = append(names, r.name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s not set (the configuration fills every option: see OptionsFor)", what, strings.Join(names, ", "))
}
