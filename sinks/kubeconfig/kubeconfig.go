// Package kubeconfig is the kubeconfig sink: it keeps a directory of
// kubeconfig files, one per (consumer namespace, cluster), for tools that
// read files rather than ClusterProfiles: Kueue's MultiKueue with
// `locationType: Path`, scripts, CI jobs.
//
// # File names
//
// The file of cluster C in consumer namespace N is "N_C.kubeconfig". A
// namespace is a DNS-1123 label and a cluster name a DNS-1123 subdomain,
// so neither contains an underscore and the name cannot be read two ways
// (ns "a-b" with cluster "c" is "a-b_c.kubeconfig", ns "a" with cluster
// "b-c" is "a_b-c.kubeconfig"). A name longer than 239 bytes (NAME_MAX 255
// less the room the temporary file of an atomic write needs) is cut to its
// first bytes followed by "_", 32 hex digits of the SHA-256 of the whole
// "N_C", and ".kubeconfig"; the second underscore keeps truncated names
// apart from full ones. See FileName.
//
// # Content
//
// Each file has one cluster named after the cluster, with the server and
// certificate-authority-data of the configured access provider and the
// cluster extension client.authentication.k8s.io/exec =
// {"clusterName": C}; one user; one context, which is the current one. In
// exec mode (the default) the user runs `hubsync creds` with the
// ManagedServiceAccount, cluster and namespace in its arguments, so the
// file never changes when the token rotates. In token mode the user holds
// the token of the credential copy, and the file is rewritten on rotation
// and removed with the copy.
//
// With consumer: kueue (for Kueue MultiKueue's locationType: Path) the
// sink runs in token mode, since Kueue refuses exec plugins, and checks
// every file against Kueue's kubeconfig rules (sinks.CheckKueueKubeconfig)
// before writing it: a file Kueue would refuse (a server host that is not
// an IP address or a DNS name, say) is logged and not written, and a
// file already there stays as it is.
//
// # Ownership
//
// Every file carries the top-level extension "hubsync.io/managed-by" =
// {"sink": "<sink name>"}. Only files whose name has the shape above and
// that carry this sink's marker are ever removed, by a profile's deletion
// or by a resync that no longer wants them; files of other writers and of
// other sink names are left alone, and a file without any hubsync marker
// is not overwritten either. A file of another hubsync sink (a renamed
// sink that kept the directory) is overwritten when this sink needs its
// name.
//
// Files are written 0600 in a 0700 directory, atomically (a temporary file
// in the same directory renamed over the target, which is what Kueue's
// watch of the parent directory reacts to), and only when their bytes
// change, so watchers are not woken for nothing.
//
// May import sinks, config, stream and hub; never syncer or bus.
package kubeconfig

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

// staleTempAge is how old a temporary file of the sink's own pattern must
// be before a resync removes it: a younger one may belong to a write under
// way (of another process that, wrongly, shares the directory).
const staleTempAge = time.Minute

// Sink keeps the kubeconfig files of one kubeconfig sink configuration.
type Sink struct {
	name      string
	dir       string
	provider  string
	msa       string
	tokenMode bool
	// kueue checks each file against Kueue's kubeconfig rules before it
	// is written (consumer: kueue).
	kueue bool
	exec  execSettings
	kube  kubernetes.Interface
	log   *slog.Logger
	now   func() time.Time

	// mu guards state. The worker never calls Deliver and Resync
	// concurrently, but the lock keeps the sink safe if a caller does.
	mu sync.Mutex
	// state holds the access provider of every key whose profile has it,
	// as last delivered: a credential change in token mode rewrites the
	// file from it.
	state map[stream.Key]stream.AccessProviderSummary
	// written holds the SHA-256 of what this sink last wrote to each
	// file: a file that still holds it is known to be ours without
	// parsing it for the marker.
	written map[string][sha256.Size]byte
}

var _ sinks.Sink = (*Sink)(nil)

// New makes a kubeconfig sink from its configuration; it matches
// sinks.Factory. Nothing is written until the first Resync.
func New(cfg config.Sink, deps sinks.Deps) (sinks.Sink, error) {
	k := cfg.Kubeconfig
	if k == nil {
		return nil, fmt.Errorf("kubeconfig sink %s: no kubeconfig section", cfg.Name)
	}
	if cfg.Name == "" {
		return nil, errors.New("kubeconfig sink: no name")
	}
	if k.Directory == "" || !filepath.IsAbs(k.Directory) {
		return nil, fmt.Errorf("kubeconfig sink %s: directory %q must be an absolute path", cfg.Name, k.Directory)
	}
	if k.AccessProvider == "" {
		return nil, fmt.Errorf("kubeconfig sink %s: no access provider", cfg.Name)
	}
	if k.ManagedServiceAccount == "" {
		return nil, fmt.Errorf("kubeconfig sink %s: no managed service account", cfg.Name)
	}
	s := &Sink{
		name:     cfg.Name,
		dir:      filepath.Clean(k.Directory),
		provider: k.AccessProvider,
		msa:      k.ManagedServiceAccount,
		kueue:    k.Consumer == config.ConsumerKueue,
		exec:     execSettings{command: k.Exec.Command, installHint: k.Exec.InstallHint},
		kube:     deps.Kube,
		log:      deps.Log,
		now:      time.Now,
		state:    map[stream.Key]stream.AccessProviderSummary{},
		written:  map[string][sha256.Size]byte{},
	}
	switch k.Auth {
	case config.AuthExec:
		if s.kueue {
			return nil, fmt.Errorf("kubeconfig sink %s: consumer %s needs auth %s: Kueue refuses exec plugins", cfg.Name, config.ConsumerKueue, config.AuthToken)
		}
		if s.exec.command == "" {
			return nil, fmt.Errorf("kubeconfig sink %s: no exec command (config.SetDefaults fills it)", cfg.Name)
		}
	case config.AuthToken:
		s.tokenMode = true
		if s.kube == nil {
			return nil, fmt.Errorf("kubeconfig sink %s: token auth needs a hub client", cfg.Name)
		}
	default:
		return nil, fmt.Errorf("kubeconfig sink %s: unknown auth %q (want %s or %s)", cfg.Name, k.Auth, config.AuthExec, config.AuthToken)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("directory", s.dir)
	return s, nil
}

// Close releases nothing: the sink holds no open files or connections, and
// its files stay where they are.
func (s *Sink) Close() error { return nil }

// Deliver applies changes to the directory in order. A change that fails
// is reported in the joined error, so the batch comes again; applying a
// change twice gives the same files.
func (s *Sink) Deliver(ctx context.Context, changes []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := sinks.EnsureDir(s.dir); err != nil {
		return fmt.Errorf("kubeconfig sink %s: %w", s.name, err)
	}
	var errs []error
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := s.apply(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", c.Type, c.Namespace, c.Cluster, err))
		}
	}
	return errors.Join(errs...)
}

// apply brings the file of c's key in line with c.
func (s *Sink) apply(ctx context.Context, c stream.Change) error {
	key := c.Key()
	log := s.log.With("namespace", key.Namespace, "cluster", key.Cluster)
	if err := validKey(key.Namespace, key.Cluster); err != nil {
		// Retrying cannot fix a name, so the change is dropped rather than
		// failed.
		log.Error("kubeconfig sink: ignoring a change whose names cannot make a file name", "type", c.Type, "error", err)
		return nil
	}
	switch c.Type {
	case stream.ProfileDeleted:
		delete(s.state, key)
		return s.remove(key, log, "profile deleted")
	case stream.ProfileCreated, stream.ProfileUpdated, stream.AccessProviderUpdated:
		if c.Profile == nil {
			log.Warn("kubeconfig sink: profile change without a profile, ignored", "type", c.Type)
			return nil
		}
		ap, ok := c.Profile.Provider(s.provider)
		if !ok {
			delete(s.state, key)
			return s.remove(key, log, "profile has no access provider "+s.provider)
		}
		s.state[key] = ap
		return s.sync(ctx, key, log)
	case stream.CredentialSynced, stream.CredentialRotated, stream.CredentialRemoved:
		// An exec-mode file reads the credential when it is used, so
		// nothing in it depends on the copy.
		if !s.tokenMode || !s.ours(c) {
			return nil
		}
		if c.Type == stream.CredentialRemoved {
			return s.remove(key, log, "credential removed")
		}
		if _, ok := s.state[key]; !ok {
			// The profile, or its provider, is not there yet; its
			// change will write the file.
			return nil
		}
		return s.sync(ctx, key, log)
	}
	return nil
}

// ours reports whether credential change c is about the sink's
// ManagedServiceAccount.
func (s *Sink) ours(c stream.Change) bool {
	if c.Credential != nil && c.Credential.ManagedServiceAccount != "" {
		return c.Credential.ManagedServiceAccount == s.msa
	}
	return c.Name == hub.CopyName(c.Cluster, s.msa)
}

// render returns the desired bytes of key's file, or nil when no file
// should exist (token mode without a token).
func (s *Sink) render(ctx context.Context, key stream.Key) ([]byte, error) {
	c := content{
		sink:      s.name,
		key:       key,
		provider:  s.state[key],
		msa:       s.msa,
		tokenMode: s.tokenMode,
		kueue:     s.kueue,
	}
	if s.tokenMode {
		tok, err := sinks.Token(ctx, s.kube, key.Namespace, key.Cluster, s.msa)
		switch {
		case errors.Is(err, sinks.ErrNoToken):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("read token: %w", err)
		}
		c.token = tok
	} else {
		c.exec = execConfig(s.exec, key, s.msa)
	}
	return render(c)
}

// sync writes key's file from the state, or removes it when token mode has
// no token to put in it. A file Kueue would refuse is not written: that is
// logged, not retried, and the file already there (if any) stays.
func (s *Sink) sync(ctx context.Context, key stream.Key, log *slog.Logger) error {
	data, err := s.render(ctx, key)
	if errors.Is(err, sinks.ErrKueueRefuses) {
		logKueueRefusal(log, FileName(key.Namespace, key.Cluster), err)
		return nil
	}
	if err != nil {
		return err
	}
	if data == nil {
		return s.remove(key, log, "credential copy has no token")
	}
	_, err = s.write(key, data, log)
	return err
}

// writeResult says what write did.
type writeResult int

const (
	written writeResult = iota
	unchanged
	refused
)

// write puts data in key's file unless it holds those bytes already. A
// file of the same name that is not a hubsync kubeconfig is left alone.
func (s *Sink) write(key stream.Key, data []byte, log *slog.Logger) (writeResult, error) {
	name := FileName(key.Namespace, key.Cluster)
	path := filepath.Join(s.dir, name)
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		// Same bytes: a rename would wake every watcher for nothing, but
		// a mode someone loosened is tightened again.
		if err := tighten(path); err != nil {
			return unchanged, err
		}
		return unchanged, nil
	case err == nil && s.written[name] == sha256.Sum256(old):
		// What this sink wrote last: ours.
	case err == nil:
		if _, ok := markerOf(old); !ok {
			log.Warn("kubeconfig sink: a file that hubsync did not write has this cluster's name; leaving it alone", "file", name)
			return refused, nil
		}
	case !errors.Is(err, fs.ErrNotExist):
		return written, fmt.Errorf("read %s: %w", path, err)
	}
	if err := sinks.WriteFileAtomic(path, data); err != nil {
		return written, err
	}
	s.written[name] = sha256.Sum256(data)
	log.Debug("kubeconfig file written", "file", name)
	return written, nil
}

// logKueueRefusal reports a file not written because Kueue would refuse
// it. The error names the broken rules and never the token.
func logKueueRefusal(log *slog.Logger, file string, err error) {
	log.Error("kubeconfig sink: not writing a file Kueue's MultiKueue would refuse (its MultiKueueCluster would stay inactive, reason InsecureKubeConfig); "+
		"the file already there, if any, is left as it is", "file", file, "error", err)
}

// tighten sets path's mode back to 0600 if it is anything else.
func tighten(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Mode().Perm() != 0o600 {
		if err := os.Chmod(path, 0o600); err != nil {
			return fmt.Errorf("chmod %s: %w", path, err)
		}
	}
	return nil
}

// remove deletes key's file if this sink wrote it.
func (s *Sink) remove(key stream.Key, log *slog.Logger, why string) error {
	name := FileName(key.Namespace, key.Cluster)
	removed, err := s.removeOwned(name)
	if removed {
		log.Debug("kubeconfig file removed", "file", name, "reason", why)
	}
	return err
}

// removeOwned deletes the file name of the directory if it carries this
// sink's marker, and reports whether it did.
func (s *Sink) removeOwned(name string) (bool, error) {
	path := filepath.Join(s.dir, name)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if s.written[name] != sha256.Sum256(data) {
		if sink, ok := markerOf(data); !ok || sink != s.name {
			s.log.Debug("kubeconfig sink: leaving a file this sink did not write", "file", name)
			return false, nil
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	delete(s.written, name)
	return true, nil
}

// Resync makes the directory hold exactly the files snapshot calls for:
// it writes those that differ and removes the files of this sink nobody
// wants any more, then logs a summary. Files that could not be brought up
// to date are kept and reported in the error, so the resync comes again.
func (s *Sink) Resync(ctx context.Context, snapshot []stream.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := sinks.EnsureDir(s.dir); err != nil {
		return fmt.Errorf("kubeconfig sink %s: %w", s.name, err)
	}
	// The snapshot is the whole current state: what was known before is
	// replaced, not merged.
	state, creds := s.snapshotState(snapshot)
	s.state = state
	res, err := s.writeAll(ctx, state, creds)
	if err != nil {
		// Stopped: without every file written, pruning would guess.
		return errors.Join(append(res.errs, err)...)
	}
	removed, err := s.prune(res.desired)
	if err != nil {
		res.errs = append(res.errs, err)
	}
	s.log.Info("kubeconfig sink resynced", "written", res.written, "removed", removed, "unchanged", res.unchanged, "failed", len(res.errs))
	return errors.Join(res.errs...)
}

// snapshotState reads a snapshot: the access provider of every profile
// that has the sink's, and the keys whose credential copy of the sink's
// ManagedServiceAccount exists.
func (s *Sink) snapshotState(snapshot []stream.Change) (map[stream.Key]stream.AccessProviderSummary, map[stream.Key]bool) {
	state := map[stream.Key]stream.AccessProviderSummary{}
	creds := map[stream.Key]bool{}
	for _, c := range snapshot {
		key := c.Key()
		if err := validKey(key.Namespace, key.Cluster); err != nil {
			s.log.Error("kubeconfig sink: ignoring a snapshot entry whose names cannot make a file name", "error", err)
			continue
		}
		switch {
		case c.Profile != nil && c.Type != stream.ProfileDeleted:
			if ap, ok := c.Profile.Provider(s.provider); ok {
				state[key] = ap
			}
		case c.Type == stream.CredentialSynced || c.Type == stream.CredentialRotated:
			if s.ours(c) {
				creds[key] = true
			}
		}
	}
	return state, creds
}

// resyncResult is what writeAll did: the file names to keep (written,
// unchanged, or kept because their render failed), the counts for the log
// and the keys' errors.
type resyncResult struct {
	desired            map[string]bool
	written, unchanged int
	errs               []error
}

// writeAll writes the file of every key of state, in order. A key whose
// render fails keeps whatever file it has until the hub answers. It
// returns ctx's error if ctx ends first.
func (s *Sink) writeAll(ctx context.Context, state map[stream.Key]stream.AccessProviderSummary, creds map[stream.Key]bool) (resyncResult, error) {
	keys := slices.SortedFunc(maps.Keys(state), func(a, b stream.Key) int {
		return strings.Compare(a.Namespace+"/"+a.Cluster, b.Namespace+"/"+b.Cluster)
	})
	r := resyncResult{desired: map[string]bool{}}
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		if s.tokenMode && !creds[key] {
			// No credential copy, so no token: the file is not wanted.
			continue
		}
		name := FileName(key.Namespace, key.Cluster)
		data, err := s.render(ctx, key)
		if errors.Is(err, sinks.ErrKueueRefuses) {
			// Kept as it is, like a file whose render fails, but a retry
			// cannot change the verdict: not an error.
			r.desired[name] = true
			logKueueRefusal(s.log.With("namespace", key.Namespace, "cluster", key.Cluster), name, err)
			continue
		}
		if err != nil {
			r.desired[name] = true
			r.errs = append(r.errs, fmt.Errorf("%s/%s: %w", key.Namespace, key.Cluster, err))
			continue
		}
		if data == nil {
			continue
		}
		r.desired[name] = true
		res, err := s.write(key, data, s.log.With("namespace", key.Namespace, "cluster", key.Cluster))
		switch {
		case err != nil:
			r.errs = append(r.errs, fmt.Errorf("%s/%s: %w", key.Namespace, key.Cluster, err))
		case res == written:
			r.written++
		case res == unchanged:
			r.unchanged++
		}
	}
	return r, nil
}

// prune removes the files of this sink that are not desired, and its own
// temporary files left behind by a crash in the middle of a write. It
// returns how many kubeconfig files it removed.
func (s *Sink) prune(desired map[string]bool) (int, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", s.dir, err)
	}
	var errs []error
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		switch {
		case isOwnName(name):
			if desired[name] {
				continue
			}
			removed, err := s.removeOwned(name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if removed {
				n++
				s.log.Debug("kubeconfig file removed", "file", name, "reason", "not in the current state")
			}
		case isOwnTemp(name):
			info, err := e.Info()
			if err != nil || s.now().Sub(info.ModTime()) < staleTempAge {
				continue
			}
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Join(s.dir, name), err))
				continue
			}
			s.log.Debug("stale temporary kubeconfig file removed", "file", name)
		}
	}
	return n, errors.Join(errs...)
}
