package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// copyToken is what a client needs of a credential copy: its token, and
// the resourceVersion it was read at, which orders two reads of the copy.
type copyToken struct {
	token           string
	resourceVersion string
}

// credential is the token of one credential copy as the Source last saw it.
// Every config handed out for the copy shares it, so one update (from the
// informer, a read after a 401, or Refresh) reaches all their clients.
type credential struct {
	// secret is "<namespace>/<name>" of the copy, for messages; source
	// is the "<cluster>/<msa>" it is a copy of.
	secret string
	source string
	// read reads the copy from the API server.
	read func(ctx context.Context) (copyToken, error)
	// minReread is the least time between two reads after a 401 that
	// found the same token: a token revoked with no replacement yet
	// costs the hub at most one read per minReread, however many
	// requests are refused.
	minReread time.Duration
	now       func() time.Time
	stats     *counters
	log       *slog.Logger

	mu         sync.Mutex
	token      string
	rv         string
	lastReread time.Time

	flight singleflight.Group
}

// readTimeout bounds a read of a copy. The read is shared by every
// request waiting for it, so it does not end with the context of the
// request that started it.
const readTimeout = 30 * time.Second

// offer adopts tok unless the credential holds a newer version of the
// copy (the informer may deliver an older version after a direct read
// returned a newer one), and reports whether the token changed.
func (c *credential) offer(tok copyToken) bool {
	if tok.token == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" {
		if order, err := resourceversion.CompareResourceVersion(tok.resourceVersion, c.rv); err == nil && order < 0 {
			return false
		}
	}
	changed := tok.token != c.token
	c.token, c.rv = tok.token, tok.resourceVersion
	return changed
}

// held is the token held now, "" before the first read.
func (c *credential) held() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// current is the token to send: the one held, else the copy's, read from
// the API server once however many requests wait for it.
func (c *credential) current(ctx context.Context) (string, error) {
	if t := c.held(); t != "" {
		return t, nil
	}
	_, err, _ := c.flight.Do("load", func() (any, error) {
		if c.held() != "" {
			return nil, nil
		}
		tok, err := c.readDetached(ctx)
		if err == nil {
			c.offer(tok)
		}
		return nil, err
	})
	if err != nil {
		return "", err
	}
	if t := c.held(); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("credential copy %s holds no token", c.secret)
}

// newer returns a token to retry a request that was refused with 401
// after being sent with sent. When the token held is still sent, the copy
// is read from the API server (the informer may lag behind it), at most
// once per minReread and once for all the requests refused meanwhile.
// ok is false when there is no other token to try.
func (c *credential) newer(ctx context.Context, sent string) (token string, ok bool) {
	if t := c.held(); t != sent && t != "" {
		return t, true
	}
	_, _, _ = c.flight.Do("reread", func() (any, error) {
		c.mu.Lock()
		if c.token != sent || c.now().Sub(c.lastReread) < c.minReread {
			c.mu.Unlock()
			return nil, nil
		}
		c.lastReread = c.now()
		c.mu.Unlock()
		c.stats.rereads.Add(1)
		tok, err := c.readDetached(ctx)
		if err != nil {
			c.log.Info("reading the credential copy after a 401 failed", "secret", c.secret, "err", err)
			return nil, nil
		}
		if c.offer(tok) {
			c.log.Info("the credential copy holds a new token, read after a 401", "secret", c.secret)
		}
		return nil, nil
	})
	t := c.held()
	return t, t != sent && t != ""
}

// readDetached reads the copy with ctx's values but not its
// cancellation, within readTimeout.
func (c *credential) readDetached(ctx context.Context) (copyToken, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
	defer cancel()
	tok, err := c.read(ctx)
	if err != nil {
		return copyToken{}, err
	}
	if tok.token == "" {
		return copyToken{}, errors.New("credential copy " + c.secret + " holds no token")
	}
	return tok, nil
}
