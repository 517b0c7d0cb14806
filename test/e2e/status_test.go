package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/status"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// TestStatusCommand runs the daemon binary with leader election and
// credential copies, and `hubsync status` against its server address, as
// an operator would through kubectl port-forward: the leader, the
// consumer namespaces with their profiles and copies, the bus sink; a
// rotation brings every copy in step again (their oldest sync moves past
// it); a copy another writer keeps at the old token is counted stale until
// hubsync takes it back; a second daemon on the same Lease reports that it
// stands by and names the leader. No token appears in any output.
func TestStatusCommand(t *testing.T) {
	h := newHarnessWithoutSyncer(t)
	bin := testutil.Hubsync(t)
	h.must(h.hub.Namespace(h.ctx, "open-cluster-management-hub"))
	nsA, nsB := h.namespaces("team-a")[0], h.namespaces("team-b")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	c1, c2 := h.name("c1"), h.name("c2")
	h.cluster(c1, set, nil)
	h.cluster(c2, set, nil)
	tokens := map[string]string{}
	for _, c := range []string{c1, c2} {
		_, err := h.hub.CreateMSA(h.ctx, c, "app", true)
		h.must(err)
		tokens[c] = fleet.FakeJWT(time.Now().Add(time.Hour))
		h.must(h.hub.PutToken(h.ctx, c, "app", tokens[c], nil))
	}
	for _, ns := range []string{nsA, nsB} {
		h.must(h.hub.Bind(h.ctx, ns, set, true))
	}

	conf := config.Config{}
	conf.LeaderElection.Enabled = true
	conf.LeaderElection.Name = h.name("lease")
	conf.LeaderElection.LeaseDuration.Duration = 4 * time.Second
	conf.LeaderElection.RenewDeadline.Duration = 3 * time.Second
	conf.LeaderElection.RetryPeriod.Duration = 500 * time.Millisecond
	conf.ForeignWriters = config.ForeignWriters{HoldOff: metav1.Duration{Duration: foreignHoldOff}, MaxHoldOff: metav1.Duration{Duration: foreignMaxHoldOff}}
	leaderLogs := &fleet.LogBuffer{}
	leader, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, leaderLogs)
	h.must(err)
	h.watchLog("the leader's log", leaderLogs)
	t.Cleanup(func() {
		_ = leader.Stop()
		if t.Failed() {
			t.Logf("the leader's log:\n%s", leaderLogs.String())
		}
	})
	h.must(leader.WaitReady(h.ctx, 60*time.Second))
	h.expectProfiles(nsA, c1, c2)
	h.expectProfiles(nsB, c1, c2)

	sc := &statusCommand{h: h, bin: bin}
	// Converged: two namespaces with two profiles and two current copies.
	st := sc.waitFor(leader.Address, "the leader's status shows both namespaces converged", func(st status.Status) error {
		if !st.Leader.Leading || st.Leader.Identity == "" {
			return fmt.Errorf("leader %+v", st.Leader)
		}
		for _, ns := range []string{nsA, nsB} {
			if n := namespaceOf(st, ns); n == nil || n.Profiles != 2 || n.Copies != 2 || n.StaleCopies != 0 || n.OldestCopySyncedAt == nil {
				return fmt.Errorf("namespace %s: %+v", ns, n)
			}
		}
		return nil
	})
	if len(st.Sinks) != 1 || st.Sinks[0].Name != "nats" || st.Sinks[0].Type != "nats" || !st.Sinks[0].Up {
		t.Errorf("sinks %+v, want the bus's nats sink, up", st.Sinks)
	}
	if st.Hub == nil || !st.Hub.Reachable || st.Config == nil || !st.Config.LastReloadSuccessful || !st.Ready || st.Reason != "ok" {
		t.Errorf("hub %+v, config %+v, ready %v (%s)", st.Hub, st.Config, st.Ready, st.Reason)
	}
	text := sc.run(leader.Address)
	t.Logf("hubsync status on the leader:\n%s", text)
	for _, want := range []string{
		"hubsync at http://" + leader.Address + ": ready (ok)",
		"leader:    this replica leads (" + st.Leader.Identity + ")",
		"hub:       reachable",
		"NAMESPACE",
		"sinks:     1 up, 0 down",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	for _, ns := range []string{nsA, nsB} {
		if !containsLine(text, "  "+ns+" ", " 2 ", " 0 ") {
			t.Errorf("text has no line for %s with 2 profiles, 2 copies, 0 stale:\n%s", ns, text)
		}
	}

	// A rotation of both sources: every copy follows, and the oldest copy
	// of each namespace was synced after it.
	synced := *namespaceOf(st, nsA).OldestCopySyncedAt
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !time.Now().Truncate(time.Second).After(synced) {
			return errors.New("still within the second of the last sync")
		}
		return nil
	}, "a second past the copies' sync")
	rotated := time.Now().Truncate(time.Second)
	old := tokens[c1]
	for _, c := range []string{c1, c2} {
		tokens[c] = fleet.FakeJWT(time.Now().Add(2 * time.Hour))
		h.must(h.hub.PutToken(h.ctx, c, "app", tokens[c], nil))
	}
	sc.waitFor(leader.Address, "every copy synced after the rotation", func(st status.Status) error {
		for _, ns := range []string{nsA, nsB} {
			n := namespaceOf(st, ns)
			if n == nil || n.Copies != 2 || n.StaleCopies != 0 || n.OldestCopySyncedAt == nil || n.OldestCopySyncedAt.Before(rotated) {
				return fmt.Errorf("namespace %s: %+v (rotated at %s)", ns, n, rotated)
			}
			if a := n.OldestCopyAgeSeconds; a == nil || *a > time.Since(rotated).Seconds()+1 {
				return fmt.Errorf("namespace %s: oldest copy age %v s, rotated %s ago", ns, a, time.Since(rotated))
			}
		}
		return nil
	})
	for _, ns := range []string{nsA, nsB} {
		sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, hub.CopyName(c1, "app"), metav1.GetOptions{})
		h.must(err)
		if string(sec.Data[hub.TokenKey]) != tokens[c1] || sec.Annotations[hub.AnnotationSyncedAt] == "" {
			t.Errorf("%s: the copy of %s holds another token, or no %s", ns, c1, hub.AnnotationSyncedAt)
		}
	}

	// Another writer keeps team-a's copy of c1 at the old token: hubsync
	// holds back from it (a contested object), and it counts as stale
	// until the writer stops and hubsync takes it back.
	copies := h.hub.Kube.CoreV1().Secrets(nsA)
	writer := (&foreignFixture{h: h}).startWriter("other-syncer", func(ctx context.Context, manager string) (bool, error) {
		sec, err := copies.Get(ctx, hub.CopyName(c1, "app"), metav1.GetOptions{})
		if err != nil || string(sec.Data[hub.TokenKey]) == old {
			return false, err
		}
		sec.Data[hub.TokenKey] = []byte(old)
		_, err = copies.Update(ctx, sec, metav1.UpdateOptions{FieldManager: manager})
		return err == nil, err
	})
	sc.waitFor(leader.Address, "team-a's copy counted stale", func(st status.Status) error {
		if n := namespaceOf(st, nsA); n == nil || n.StaleCopies != 1 || st.Consumers.StaleCopies != 1 {
			return fmt.Errorf("namespace %s: %+v", nsA, n)
		}
		return nil
	})
	writer.stop()
	sc.waitFor(leader.Address, "no stale copy once the writer stopped", func(st status.Status) error {
		if n := namespaceOf(st, nsA); n == nil || n.StaleCopies != 0 || n.Copies != 2 {
			return fmt.Errorf("namespace %s: %+v", nsA, n)
		}
		return nil
	})

	// A second replica on the same Lease stands by and names the leader.
	followerLogs := &fleet.LogBuffer{}
	follower, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, followerLogs)
	h.must(err)
	h.watchLog("the follower's log", followerLogs)
	t.Cleanup(func() {
		_ = follower.Stop()
		if t.Failed() {
			t.Logf("the follower's log:\n%s", followerLogs.String())
		}
	})
	h.must(follower.WaitReady(h.ctx, 60*time.Second))
	fst := sc.waitFor(follower.Address, "the follower names the leader", func(fst status.Status) error {
		if fst.Leader.Leading || fst.Leader.Identity != st.Leader.Identity {
			return fmt.Errorf("leader %+v, want another replica: %s", fst.Leader, st.Leader.Identity)
		}
		return nil
	})
	if fst.Consumers != nil || fst.Sinks != nil || fst.Reason != "standby" {
		t.Errorf("the follower reports consumers %+v, sinks %+v, reason %q", fst.Consumers, fst.Sinks, fst.Reason)
	}
	text = sc.run(follower.Address)
	t.Logf("hubsync status on the follower:\n%s", text)
	if want := "leader:    another replica leads: " + st.Leader.Identity; !strings.Contains(text, want) || strings.Contains(text, "NAMESPACE") {
		t.Errorf("the follower's text lacks %q or lists namespaces:\n%s", want, text)
	}

	// An address where nothing listens is an error that says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	h.must(err)
	closed := ln.Addr().String()
	h.must(ln.Close())
	out, err := exec.CommandContext(h.ctx, bin, "status", "--address", closed).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "no answer from http://"+closed+"/metrics") {
		t.Errorf("status against %s: exit %d, output:\n%s", closed, code, out)
	}

	for _, f := range leak.Tokens(sc.outputs.String(), h.hub.Tokens()) {
		t.Errorf("%s appears in hubsync status's output", f)
	}
}

// statusCommand runs `hubsync status` and keeps every output, for the
// check that none holds a token.
type statusCommand struct {
	h       *harness
	bin     string
	outputs bytes.Buffer
}

// run runs `hubsync status --address address args...` and returns its
// output, failing the test when it fails.
func (s *statusCommand) run(address string, args ...string) string {
	s.h.t.Helper()
	out, err := s.output(address, args...)
	if err != nil {
		s.h.t.Fatal(err)
	}
	return out
}

func (s *statusCommand) output(address string, args ...string) (string, error) {
	cmd := exec.CommandContext(s.h.ctx, s.bin, append([]string{"status", "--address", address}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	s.outputs.Write(stdout.Bytes())
	s.outputs.Write(stderr.Bytes())
	if err != nil {
		return "", fmt.Errorf("hubsync status %v: %w: %s", args, err, stderr.String())
	}
	return stdout.String(), nil
}

// waitFor runs `hubsync status -o json` until check accepts what it says,
// and returns that.
func (s *statusCommand) waitFor(address, what string, check func(status.Status) error) status.Status {
	s.h.t.Helper()
	var st status.Status
	testutil.Eventually(s.h.t, 60*time.Second, 100*time.Millisecond, func() error {
		out, err := s.output(address, "-o", "json")
		if err != nil {
			return err
		}
		st = status.Status{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return testutil.Stop(fmt.Errorf("decode %s: %w", out, err))
		}
		return check(st)
	}, "%s", what)
	return st
}

func namespaceOf(st status.Status, ns string) *status.Namespace {
	if st.Consumers == nil {
		return nil
	}
	for i := range st.Consumers.Namespaces {
		if st.Consumers.Namespaces[i].Name == ns {
			return &st.Consumers.Namespaces[i]
		}
	}
	return nil
}

// containsLine reports whether a line of text holds every part, in order.
func containsLine(text string, parts ...string) bool {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := line+" ", true
		for _, p := range parts {
			var found bool
			_, rest, found = strings.Cut(rest, p)
			ok = ok && found
		}
		if ok {
			return true
		}
	}
	return false
}

func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}
