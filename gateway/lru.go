package gateway

import (
	"container/list"
	"sync"
	"time"
)

// expiring is a bounded map whose entries expire: when it is full, the
// least recently used entry goes first. It holds the gateway's memories of
// tokens (reviews, verifications, refusals, keyed by the token's SHA-256,
// never the token) and of client addresses, so a stranger sending new
// tokens or addresses can never grow it past its size.
type expiring[K comparable, V any] struct {
	size int

	mu      sync.Mutex
	entries map[K]*list.Element
	order   *list.List // front: most recently used
}

type expiringEntry[K comparable, V any] struct {
	key     K
	val     V
	expires time.Time
}

func newExpiring[K comparable, V any](size int) *expiring[K, V] {
	return &expiring[K, V]{size: max(size, 1), entries: map[K]*list.Element{}, order: list.New()}
}

// get returns key's value while now is before its expiry; an expired
// entry is dropped.
func (c *expiring[K, V]) get(key K, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*expiringEntry[K, V])
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.entries, key)
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return e.val, true
}

// put stores key until expires, evicting the least recently used entries
// beyond the size.
func (c *expiring[K, V]) put(key K, val V, expires time.Time) {
	c.store(key, val, expires, func(*expiringEntry[K, V]) bool { return true })
}

// putIfRoom is put, unless the map is full and its least recently used
// entry has not expired: then nothing is stored or evicted, and it
// reports false.
func (c *expiring[K, V]) putIfRoom(key K, val V, expires, now time.Time) bool {
	return c.store(key, val, expires, func(oldest *expiringEntry[K, V]) bool { return !now.Before(oldest.expires) })
}

// store stores key until expires. A new key in a full map evicts the
// least recently used entry if evict allows it, and is not stored
// otherwise (false).
func (c *expiring[K, V]) store(key K, val V, expires time.Time, evict func(oldest *expiringEntry[K, V]) bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*expiringEntry[K, V])
		e.val, e.expires = val, expires
		c.order.MoveToFront(el)
		return true
	}
	if c.order.Len() >= c.size {
		oldest := c.order.Back()
		e := oldest.Value.(*expiringEntry[K, V])
		if !evict(e) {
			return false
		}
		c.order.Remove(oldest)
		delete(c.entries, e.key)
	}
	c.entries[key] = c.order.PushFront(&expiringEntry[K, V]{key: key, val: val, expires: expires})
	return true
}

func (c *expiring[K, V]) remove(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.order.Remove(el)
		delete(c.entries, key)
	}
}

func (c *expiring[K, V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
