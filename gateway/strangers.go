package gateway

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// strangers limits, per client address, the requests the gateway
// refuses: each refusal takes a token from the address's bucket, and an
// address whose bucket is empty gets 429 for every request whose bearer
// token the gateway has not recently accepted, before any TokenReview or
// key lookup is spent on it. A client with a good token is never slowed
// by a stranger, even one behind the same address, once its token has
// been accepted.
type strangers struct {
	limit rate.Limit
	burst int
	now   func() time.Time
	// buckets are forgotten once full again (they then hold nothing the
	// next request would not start with), and bounded in number. A bucket
	// is never evicted before it is full again, which would refill it:
	// an address that finds no room shares overflow with every other
	// such address, so a stranger rotating addresses drains that one.
	buckets  *expiring[string, *rate.Limiter]
	overflow *rate.Limiter
}

// newStrangers takes the gateway's checked options: positive rates and
// bounds.
func newStrangers(perSecond float64, burst, addresses int, now func() time.Time) *strangers {
	return &strangers{limit: rate.Limit(perSecond), burst: burst, now: now,
		buckets: newExpiring[string, *rate.Limiter](addresses), overflow: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// refillTime is how long an empty bucket takes to fill.
func (s *strangers) refillTime() time.Duration {
	return time.Duration(float64(s.burst) / float64(s.limit) * float64(time.Second))
}

// admit takes one refusal from addr's bucket ahead of a check whose
// answer may be a refusal (a TokenReview, a key lookup): concurrent
// requests from one address then cannot all pass before the first of
// them is refused. release gives it back when the answer was not a
// refusal. ok is false when the bucket is empty, with the wait until it
// holds one again.
func (s *strangers) admit(addr string) (release func(), wait time.Duration, ok bool) {
	now := s.now()
	l := s.bucket(addr, now)
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); !r.OK() || d > 0 {
		r.CancelAt(now)
		return nil, max(d.Round(time.Second), time.Second), false
	}
	var once sync.Once
	return func() { once.Do(func() { giveBack(l, s.now()) }) }, 0, true
}

// giveBack returns one token to l. A Reservation's CancelAt gives nothing
// back once any time has passed since the reservation (it only undoes a
// reservation whose time to act is still ahead), so the token is put
// back as a reservation of -1, which x/time/rate adds to the bucket; the
// bucket's cap applies again at its next use.
func giveBack(l *rate.Limiter, now time.Time) { l.ReserveN(now, -1) }

// charge takes one refusal from addr's bucket.
func (s *strangers) charge(addr string) {
	now := s.now()
	s.bucket(addr, now).AllowN(now, 1)
}

// bucket is addr's bucket, kept until it would be full again (it then
// holds nothing the next request would not start with); the overflow
// bucket when there is no room for it.
func (s *strangers) bucket(addr string, now time.Time) *rate.Limiter {
	l, ok := s.buckets.get(addr, now)
	if !ok {
		l = rate.NewLimiter(s.limit, s.burst) // full
	}
	if !s.buckets.putIfRoom(addr, l, now.Add(s.refillTime()), now) {
		return s.overflow
	}
	return l
}

// clientAddress is the key of a request's bucket: the peer's IP address,
// or its /64 for IPv6 (one host commonly holds a whole /64).
func clientAddress(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	return addressKey(ip)
}

func addressKey(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// clientOf is the key of r's bucket. A connection from one of trusted
// (a front proxy that hides client addresses) names its client in
// header: the rightmost address there that is not itself a trusted
// proxy, as each proxy appends the address it received from
// (X-Forwarded-For); a header the proxy does not set, or that holds
// anything but addresses, keys the request by the proxy's own address.
// Any other connection is its TCP peer, whatever it sends.
func clientOf(r *http.Request, header string, trusted []netip.Prefix) string {
	peer := clientAddress(r.RemoteAddr)
	if header == "" {
		return peer
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !inAny(ap.Addr().Unmap(), trusted) {
		return peer
	}
	var hops []string
	for _, v := range r.Header.Values(header) {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		ip, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return peer
		}
		if ip = ip.Unmap(); !inAny(ip, trusted) {
			return addressKey(ip)
		}
	}
	return peer
}

func inAny(ip netip.Addr, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}
