package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/leak"
	"github.com/hubsync/hubsync/test/testutil"
)

// withCredentials turns credential copies on with a short coalescing window.
func withCredentials(t *testing.T) harnessOption {
	return withOptions(func(o *syncer.Options) {
		c, err := msaclient.NewForConfig(hubConfig)
		if err != nil {
			t.Fatal(err)
		}
		o.Credentials = &syncer.CredentialOptions{Client: c, Workers: 4, Coalesce: 100 * time.Millisecond}
	})
}

// credFixture is a cluster bound into namespaces, with one synced MSA.
type credFixture struct {
	h        *harness
	ns       []string
	set      string
	cluster  string
	msa      string
	copyName string
}

func newCredFixture(t *testing.T, namespaces ...string) *credFixture {
	h := newHarness(t, withCredentials(t))
	f := &credFixture{h: h, ns: h.namespaces(namespaces...), set: h.name("set"), cluster: h.name("c"), msa: "app"}
	f.copyName = f.cluster + "-" + f.msa
	h.must(h.hub.CreateExclusiveSet(h.ctx, f.set))
	h.cluster(f.cluster, f.set, nil)
	for _, n := range f.ns {
		h.must(h.hub.Bind(h.ctx, n, f.set, true))
	}
	h.expectProfiles(f.ns[0], f.cluster)
	return f
}

func (f *credFixture) token(exp time.Time) string {
	tok := fleet.FakeJWT(exp)
	f.h.hub.NoteToken(tok)
	return tok
}

// expectCopies waits until exactly the given namespaces hold a copy that
// matches the hub Secret, with the label, annotations and ownerReference
// the contract requires, and no other namespace of the test holds one.
func (f *credFixture) expectCopies(token, expiry string, namespaces ...string) {
	h := f.h
	h.t.Helper()
	h.eventually(fmt.Sprintf("copies of %s in %v", f.copyName, namespaces), func() error {
		want := map[string]bool{}
		for _, n := range namespaces {
			want[n] = true
		}
		for _, n := range f.ns {
			sec, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, f.copyName, metav1.GetOptions{})
			if !want[n] {
				if err == nil {
					return fmt.Errorf("unexpected copy in %s", n)
				}
				continue
			}
			if err != nil {
				return err
			}
			if string(sec.Data["token"]) != token || string(sec.Data["ca.crt"]) == "" || sec.Type != corev1.SecretTypeOpaque {
				return fmt.Errorf("%s: copy data/type not current", n)
			}
			if v := sec.Labels["authentication.open-cluster-management.io/synced-from"]; v != hub.SyncedFromValue(f.cluster, f.msa) {
				return fmt.Errorf("%s: synced-from %q", n, v)
			}
			if v := sec.Annotations[hub.AnnotationTokenFingerprint]; v != hub.TokenFingerprint([]byte(token)) {
				return fmt.Errorf("%s: fingerprint %q", n, v)
			}
			if v := sec.Annotations[hub.AnnotationTokenExpiration]; v != expiry {
				return fmt.Errorf("%s: expiration %q, want %q", n, v, expiry)
			}
			p := h.profile(n, f.cluster)
			if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != p.UID || sec.OwnerReferences[0].Kind != "ClusterProfile" ||
				sec.OwnerReferences[0].Controller == nil || !*sec.OwnerReferences[0].Controller {
				return fmt.Errorf("%s: ownerReferences %+v, profile UID %s", n, sec.OwnerReferences, p.UID)
			}
		}
		return nil
	})
}

func rfc3339(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

func TestCredentialCopiesAndRotation(t *testing.T) {
	f := newCredFixture(t, "a", "b")
	h := f.h
	jwtExp := time.Now().Add(time.Hour)
	_, err := h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	tok1 := f.token(jwtExp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, tok1, nil))
	// No MSA status yet: the expiry comes from the JWT.
	f.expectCopies(tok1, rfc3339(jwtExp), f.ns...)

	// The agent reports the expiry in the MSA status: it wins.
	statusExp := time.Now().Add(50 * time.Minute)
	h.must(h.hub.SetMSAExpiration(h.ctx, f.cluster, f.msa, statusExp))
	f.expectCopies(tok1, rfc3339(statusExp), f.ns...)

	// A rotation updates every copy, with one Event and log line.
	tok2 := f.token(time.Now().Add(2 * time.Hour))
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, tok2, nil))
	f.expectCopies(tok2, rfc3339(statusExp), f.ns...)
	h.expectEvent(f.cluster, f.msa, "CredentialRotated")
	if !strings.Contains(h.logs.String(), "credential rotated") {
		t.Fatalf("no log line for the rotation")
	}

	// A burst of rotations costs at most two writes per copy: the first
	// change goes at once, the rest together.
	h.waitIdle()
	before := h.metric("hubsync_credential_writes_total", map[string]string{"op": "update"})
	var last string
	for range 5 {
		last = f.token(time.Now().Add(3 * time.Hour))
		h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, last, nil))
	}
	f.expectCopies(last, rfc3339(statusExp), f.ns...)
	h.waitIdle()
	if got := h.metric("hubsync_credential_writes_total", map[string]string{"op": "update"}) - before; got < float64(len(f.ns)) || got > float64(2*len(f.ns)) {
		t.Fatalf("a burst of 5 rotations cost %v copy updates, want %d to %d (one or two per copy)", got, len(f.ns), 2*len(f.ns))
	}

	// A tampered copy is repaired.
	sec, err := h.hub.Kube.CoreV1().Secrets(f.ns[0]).Get(h.ctx, f.copyName, metav1.GetOptions{})
	h.must(err)
	sec.Data["token"] = []byte("tampered")
	_, err = h.hub.Kube.CoreV1().Secrets(f.ns[0]).Update(h.ctx, sec, metav1.UpdateOptions{})
	h.must(err)
	f.expectCopies(last, rfc3339(statusExp), f.ns...)

	// A deleted copy comes back.
	h.must(h.hub.Kube.CoreV1().Secrets(f.ns[1]).Delete(h.ctx, f.copyName, metav1.DeleteOptions{}))
	f.expectCopies(last, rfc3339(statusExp), f.ns...)
}

func TestCredentialCopiesFollowProfilesAndLabels(t *testing.T) {
	f := newCredFixture(t, "a", "b", "c")
	h := f.h
	exp := time.Now().Add(time.Hour)
	_, err := h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	tok := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, tok, nil))
	f.expectCopies(tok, rfc3339(exp), f.ns...)

	// Profile deleted (and restored by hubsync with a new UID): the copy's
	// ownerReference follows the new profile.
	old := h.profile(f.ns[0], f.cluster).UID
	h.must(h.hub.Profiles.ApisV1alpha1().ClusterProfiles(f.ns[0]).Delete(h.ctx, f.cluster, metav1.DeleteOptions{}))
	h.eventually("profile recreated", func() error {
		p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(f.ns[0]).Get(h.ctx, f.cluster, metav1.GetOptions{})
		if err != nil || p.UID == old {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	f.expectCopies(tok, rfc3339(exp), f.ns...)

	// Unbinding a namespace removes its copy with its profile (no garbage
	// collector needed).
	h.must(h.hub.Unbind(h.ctx, f.ns[2], f.set))
	h.expectProfiles(f.ns[2])
	f.expectCopies(tok, rfc3339(exp), f.ns[0], f.ns[1])

	// Removing the sync label removes every copy at once; restoring it
	// brings them back.
	h.must(h.hub.SetMSASync(h.ctx, f.cluster, f.msa, false))
	f.expectCopies(tok, rfc3339(exp))
	h.must(h.hub.SetMSASync(h.ctx, f.cluster, f.msa, true))
	f.expectCopies(tok, rfc3339(exp), f.ns[0], f.ns[1])

	// Deleting the hub token Secret removes the copies (no stale token).
	h.must(h.hub.Kube.CoreV1().Secrets(f.cluster).Delete(h.ctx, f.msa, metav1.DeleteOptions{}))
	f.expectCopies(tok, rfc3339(exp))
	tok2 := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, tok2, nil))
	f.expectCopies(tok2, rfc3339(exp), f.ns[0], f.ns[1])

	// Deleting the MSA removes them too.
	h.must(h.hub.MSA.AuthenticationV1beta1().ManagedServiceAccounts(f.cluster).Delete(h.ctx, f.msa, metav1.DeleteOptions{}))
	f.expectCopies(tok2, rfc3339(exp))
}

func TestCredentialBadInput(t *testing.T) {
	f := newCredFixture(t, "a")
	h := f.h
	ns := f.ns[0]
	exp := time.Now().Add(time.Hour)

	// Missing token key, then an empty token: nothing copied, reported once.
	_, err := h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, "", map[string][]byte{"ca.crt": []byte("CA")}))
	h.expectEvent(f.cluster, f.msa, "CredentialNotCopied")
	h.waitIdle()
	f.expectCopies("", "")
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, "", map[string][]byte{"token": {}, "ca.crt": []byte("CA")}))
	h.waitIdle()
	f.expectCopies("", "")
	if v := h.metric("hubsync_credential_problems", nil); v != 1 {
		t.Fatalf("credential problems = %v, want 1", v)
	}

	// A token that is not a JWT is copied, without an expiry.
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, "", map[string][]byte{"token": []byte("opaque-token-value"), "ca.crt": []byte("CA")}))
	h.eventually("opaque token copied", func() error {
		sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, f.copyName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(sec.Data["token"]) != "opaque-token-value" || sec.Annotations[hub.AnnotationTokenExpiration] != "" {
			return fmt.Errorf("copy %v", sec.Annotations)
		}
		return nil
	})
	h.waitIdle()
	if v := h.metric("hubsync_credential_problems", nil); v != 0 {
		t.Fatalf("credential problems = %v after the fix, want 0", v)
	}

	// A malformed rotation keeps the last good copy rather than cutting
	// consumers off.
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, "", map[string][]byte{"ca.crt": []byte("CA")}))
	h.waitIdle()
	sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, f.copyName, metav1.GetOptions{})
	h.must(err)
	if string(sec.Data["token"]) != "opaque-token-value" {
		t.Fatalf("the last good copy was not kept")
	}

	// Two pairs whose copies share a name: a-b/c and a/b-c. The first
	// keeps the name; the second is reported, never overwriting.
	other := f.cluster + "-x"
	h.cluster(other, f.set, nil)
	h.expectProfiles(ns, f.cluster, other)
	_, err = h.hub.CreateMSA(h.ctx, other, "y", true)
	h.must(err)
	tokA := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, other, "y", tokA, nil))
	name := other + "-y" // == f.cluster + "-" + "x-y"
	h.eventually("first pair's copy", func() error {
		_, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, name, metav1.GetOptions{})
		return err
	})
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, "x-y", true)
	h.must(err)
	tokB := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "x-y", tokB, nil))
	h.expectEvent(f.cluster, "x-y", "CredentialNotCopied")
	h.waitIdle()
	sec, err = h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, name, metav1.GetOptions{})
	h.must(err)
	if string(sec.Data["token"]) != tokA {
		t.Fatalf("a name collision overwrote another pair's copy")
	}

	// A Secret of someone else's with the copy's name is left alone.
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: f.cluster + "-mine", Namespace: ns}, StringData: map[string]string{"token": "theirs"}}
	_, err = h.hub.Kube.CoreV1().Secrets(ns).Create(h.ctx, foreign, metav1.CreateOptions{})
	h.must(err)
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, "mine", true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "mine", f.token(exp), nil))
	h.expectEvent(f.cluster, "mine", "CredentialNotCopied")
	got, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, f.cluster+"-mine", metav1.GetOptions{})
	h.must(err)
	if string(got.Data["token"]) != "theirs" {
		t.Fatalf("a foreign Secret was overwritten")
	}

	// An MSA without the sync label is never copied.
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, "private", false)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "private", f.token(exp), nil))
	h.waitIdle()
	if _, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, f.cluster+"-private", metav1.GetOptions{}); err == nil {
		t.Fatalf("an MSA without the sync label was copied")
	}

	// A profile of another cluster manager gets no copy.
	foreignNS := h.namespaces("foreign")[0]
	_, err = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(foreignNS).Create(h.ctx, foreignProfile(foreignNS, f.cluster), metav1.CreateOptions{})
	h.must(err)
	h.waitIdle()
	if _, err := h.hub.Kube.CoreV1().Secrets(foreignNS).Get(h.ctx, f.copyName, metav1.GetOptions{}); err == nil {
		t.Fatalf("a profile of another cluster manager received a copy")
	}
}

// TestCredentialLongNames: a synced-from value over 63 characters is
// shortened; a copy name over 253 characters is reported, not retried hot.
// (A cluster's name is at most 63 characters, being a namespace's; the
// MSA's name may have 253.)
func TestCredentialLongNames(t *testing.T) {
	h := newHarness(t, withCredentials(t))
	ns := h.namespaces("a")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	c := h.name("c")
	h.cluster(c, set, nil)
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	h.expectProfiles(ns, c)
	mid := "app." + strings.Repeat("m", 70)   // copy name ~ 80: a valid name, too long a label
	long := "app." + strings.Repeat("l", 249) // copy name > 253
	exp := time.Now().Add(time.Hour)
	for _, m := range []string{mid, long} {
		_, err := h.hub.CreateMSA(h.ctx, c, m, true)
		h.must(err)
		h.must(h.hub.PutToken(h.ctx, c, m, fleet.FakeJWT(exp), nil))
	}
	h.eventually("shortened synced-from", func() error {
		sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, c+"-"+mid, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v := sec.Labels["authentication.open-cluster-management.io/synced-from"]; len(v) > 63 || v != hub.SyncedFromValue(c, mid) {
			return fmt.Errorf("synced-from %q", v)
		}
		return nil
	})
	h.expectEvent(c, long, "CredentialNotCopied")
	h.waitIdle()
	if v := h.metric("hubsync_credential_problems", nil); v != 1 {
		t.Fatalf("credential problems = %v, want 1", v)
	}
	if v := h.metric("hubsync_profile_write_errors_total", nil); v != 0 {
		t.Fatalf("%v failed writes: the over-long name was tried", v)
	}
}

func foreignProfile(ns, name string) *cpv1alpha1.ClusterProfile {
	return &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"x-k8s.io/cluster-manager": "someone-else"}},
		Spec:       cpv1alpha1.ClusterProfileSpec{ClusterManager: cpv1alpha1.ClusterManager{Name: "someone-else"}},
	}
}

// TestCredentialRemovesStaleUpstreamCopies: copies the upstream syncer left
// for pairs that no longer sync (the MSA lost its label, or is gone) are
// removed when hubsync takes over; a Secret that only carries the label,
// without the upstream syncer's controller reference, is left alone.
func TestCredentialRemovesStaleUpstreamCopies(t *testing.T) {
	f := newCredFixture(t, "a")
	h := f.h
	ns := f.ns[0]
	p := h.profile(ns, f.cluster)
	upstream := func(msa string, owned bool) string {
		name := f.cluster + "-" + msa
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Labels: map[string]string{"authentication.open-cluster-management.io/synced-from": name}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"token": []byte(f.token(time.Now())), "ca.crt": []byte("OLD")},
		}
		if owned {
			sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile",
				Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
		}
		_, err := h.hub.Kube.CoreV1().Secrets(ns).Create(h.ctx, sec, metav1.CreateOptions{})
		h.must(err)
		return name
	}
	_, err := h.hub.CreateMSA(h.ctx, f.cluster, "unlabelled", false)
	h.must(err)
	unlabelled := upstream("unlabelled", true)
	gone := upstream("gone", true)
	foreign := upstream("not-ours", false)
	for _, name := range []string{unlabelled, gone} {
		h.eventually("stale upstream copy "+name+" removed", func() error {
			_, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})
	}
	h.waitIdle()
	if _, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, foreign, metav1.GetOptions{}); err != nil {
		t.Fatalf("a Secret without the upstream syncer's owner reference was touched: %v", err)
	}
	if !strings.Contains(h.logs.String(), "the upstream syncer") {
		t.Errorf("the removal of an upstream copy is not logged as such")
	}
}

// TestCredentialAdoptsUpstreamCopies: a copy left by managed-serviceaccount's
// syncer (its label, no hubsync annotations, an old token) is adopted and
// brought up to date when hubsync takes over, not reported as a conflict.
func TestCredentialAdoptsUpstreamCopies(t *testing.T) {
	f := newCredFixture(t, "a")
	h := f.h
	ns := f.ns[0]
	p := h.profile(ns, f.cluster)
	// As the upstream syncer writes it: its label and a controller
	// reference to the profile.
	upstream := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: f.copyName, Namespace: ns,
			Labels: map[string]string{"authentication.open-cluster-management.io/synced-from": f.copyName},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile",
				Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"token": []byte(f.token(time.Now())), "ca.crt": []byte("OLD")},
	}
	_, err := h.hub.Kube.CoreV1().Secrets(ns).Create(h.ctx, upstream, metav1.CreateOptions{})
	h.must(err)
	exp := time.Now().Add(time.Hour)
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	tok := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, tok, nil))
	f.expectCopies(tok, rfc3339(exp), ns)
	h.waitIdle()
	if v := h.metric("hubsync_credential_problems", nil); v != 0 {
		t.Fatalf("the upstream copy was reported as a conflict")
	}
}

// TestCredentialFollowsTokenSecretRef: copies come only from the token
// Secret the agent has reported in the MSA's status.tokenSecretRef, and
// from that Secret whatever its name.
func TestCredentialFollowsTokenSecretRef(t *testing.T) {
	f := newCredFixture(t, "a", "b")
	h := f.h
	_, err := h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	exp := time.Now().Add(time.Hour)

	// A token Secret the agent has not reported yet is not copied. A second
	// pair, reported, whose Secret is written after it, is copied: its copy
	// appearing first proves the first pair was seen and left alone.
	unreported := f.token(exp)
	_, err = h.hub.PutTokenSecret(h.ctx, f.cluster, f.msa, unreported, nil)
	h.must(err)
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, "other", true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "other", f.token(exp), nil))
	h.eventually("the reported pair's copies", func() error {
		for _, n := range f.ns {
			if _, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, f.cluster+"-other", metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	for _, n := range f.ns {
		if _, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, f.copyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("copy of an unreported token Secret in %s: %v", n, err)
		}
	}

	// Reported: copied.
	h.must(h.hub.ReportTokenSecret(h.ctx, f.cluster, f.msa, f.msa))
	f.expectCopies(unreported, rfc3339(exp), f.ns...)

	// The agent reports a Secret of another name: its token is copied, and
	// a rotation of that Secret reaches every copy.
	renamed := f.msa + "-token-x7k2p"
	tok2 := f.token(exp)
	_, err = h.hub.PutTokenSecret(h.ctx, f.cluster, renamed, tok2, nil)
	h.must(err)
	h.must(h.hub.ReportTokenSecret(h.ctx, f.cluster, f.msa, renamed))
	f.expectCopies(tok2, rfc3339(exp), f.ns...)
	tok3 := f.token(exp)
	_, err = h.hub.PutTokenSecret(h.ctx, f.cluster, renamed, tok3, nil)
	h.must(err)
	f.expectCopies(tok3, rfc3339(exp), f.ns...)

	// The Secret named after the MSA is no longer the source: changing it
	// changes nothing, as the other pair's later rotation landing shows.
	_, err = h.hub.PutTokenSecret(h.ctx, f.cluster, f.msa, f.token(exp), nil)
	h.must(err)
	otherTok := f.token(exp)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "other", otherTok, nil))
	h.eventually("the other pair's rotation", func() error {
		for _, n := range f.ns {
			sec, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, f.cluster+"-other", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if string(sec.Data["token"]) != otherTok {
				return fmt.Errorf("%s: not rotated yet", n)
			}
		}
		return nil
	})
	f.expectCopies(tok3, rfc3339(exp), f.ns...)

	// Deleting the reported Secret ends access.
	h.must(h.hub.Kube.CoreV1().Secrets(f.cluster).Delete(h.ctx, renamed, metav1.DeleteOptions{}))
	f.expectCopies("", "")
}

// TestCredentialForgedMarks: a Secret that carries a copy's label and
// annotation but is not controlled by the cluster's profile is someone
// else's: never overwritten, never deleted, and the pair is reported.
func TestCredentialForgedMarks(t *testing.T) {
	f := newCredFixture(t, "a")
	h := f.h
	ns := f.ns[0]
	forged := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: f.copyName, Namespace: ns,
			Labels:      map[string]string{"authentication.open-cluster-management.io/synced-from": f.copyName},
			Annotations: map[string]string{hub.AnnotationSource: hub.SourceKey(f.cluster, f.msa)},
		},
		StringData: map[string]string{"token": "theirs"},
	}
	_, err := h.hub.Kube.CoreV1().Secrets(ns).Create(h.ctx, forged, metav1.CreateOptions{})
	h.must(err)
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, f.msa, true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, f.msa, f.token(time.Now().Add(time.Hour)), nil))
	h.expectEvent(f.cluster, f.msa, "CredentialNotCopied")
	theirs := func(what string) {
		t.Helper()
		got, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, f.copyName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the forged Secret was deleted: %v", what, err)
		}
		if string(got.Data["token"]) != "theirs" {
			t.Fatalf("%s: the forged Secret was overwritten", what)
		}
	}
	theirs("pair syncing")
	if got := h.metric("hubsync_credential_problems", nil); got != 1 {
		t.Errorf("hubsync_credential_problems = %v, want 1", got)
	}

	// The pair stops syncing: the removal of its copies spares the Secret.
	// A second pair's removal, after it, shows the first was handled.
	_, err = h.hub.CreateMSA(h.ctx, f.cluster, "other", true)
	h.must(err)
	h.must(h.hub.PutToken(h.ctx, f.cluster, "other", f.token(time.Now().Add(time.Hour)), nil))
	otherCopy := f.cluster + "-other"
	h.eventually("other pair copied", func() error {
		_, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, otherCopy, metav1.GetOptions{})
		return err
	})
	h.must(h.hub.SetMSASync(h.ctx, f.cluster, f.msa, false))
	h.must(h.hub.SetMSASync(h.ctx, f.cluster, "other", false))
	h.eventually("other pair's copy removed", func() error {
		if _, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, otherCopy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	theirs("pair no longer syncing")
}

// TestImpersonatorNeverCopied runs the real daemon with the tunnel on and
// tunnel.managedServiceAccount naming the gateway's impersonating
// credential. That MSA, though labelled sync-to-clusterprofile, is never
// copied; copies of it an earlier configuration left behind are removed;
// the refusal is reported once, as a Warning Event on the MSA, a log line
// and hubsync_credential_problems{reason="impersonator"}. Another labelled
// MSA of the same cluster is copied as usual, and the daemon, its pool
// included, keeps running.
func TestImpersonatorNeverCopied(t *testing.T) {
	bin := testutil.Hubsync(t)
	h := newHarnessWithoutSyncer(t)
	ns := h.namespaces("a", "b")
	set, cluster := h.name("set"), h.name("c")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.cluster(cluster, set, nil)
	for _, n := range ns {
		h.must(h.hub.Bind(h.ctx, n, set, true))
	}
	const impersonator, app = "gateway-impersonator", "app"
	stop := func(d *fleet.Daemon, logs *fleet.LogBuffer) {
		if err := d.Stop(); err != nil {
			t.Errorf("hubsync did not stop cleanly: %v", err)
		}
		for _, f := range leak.Tokens(logs.String(), h.hub.Tokens()) {
			t.Errorf("%s appears in hubsync's log", f)
		}
		if t.Failed() {
			t.Logf("hubsync logs:\n%s", logs.String())
		}
	}

	// An earlier configuration, tunnel off, wrote the profiles.
	earlierLogs := &fleet.LogBuffer{}
	earlier, err := fleet.StartDaemon(h.ctx, bin, hubConfig, config.Config{}, earlierLogs)
	h.must(err)
	if err := earlier.WaitReady(h.ctx, 60*time.Second); err != nil {
		stop(earlier, earlierLogs)
		t.Fatal(err)
	}
	for _, n := range ns {
		h.expectProfiles(n, cluster)
	}
	stop(earlier, earlierLogs)

	// The impersonator's copies, as a hubsync that copied it would have
	// left them: its name, label, annotations and a controller reference
	// to the live profile, holding a token.
	stale := fleet.FakeJWT(time.Now().Add(time.Hour))
	h.hub.NoteToken(stale)
	copyName := cluster + "-" + impersonator
	for _, n := range ns {
		p := h.profile(n, cluster)
		_, err := h.hub.Kube.CoreV1().Secrets(n).Create(h.ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: copyName, Namespace: n,
				Labels: map[string]string{"authentication.open-cluster-management.io/synced-from": hub.SyncedFromValue(cluster, impersonator)},
				Annotations: map[string]string{
					hub.AnnotationSource:           hub.SourceKey(cluster, impersonator),
					hub.AnnotationTokenFingerprint: hub.TokenFingerprint([]byte(stale)),
				},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ClusterProfile",
					Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"token": []byte(stale), "ca.crt": []byte("CA")},
		}, metav1.CreateOptions{})
		h.must(err)
	}
	exp := time.Now().Add(time.Hour)
	for _, m := range []string{impersonator, app} {
		_, err := h.hub.CreateMSA(h.ctx, cluster, m, true)
		h.must(err)
		h.must(h.hub.PutToken(h.ctx, cluster, m, fleet.FakeJWT(exp), nil))
	}

	// Now the tunnel is on, with the impersonator as its credential. The
	// direct transport needs no konnectivity; the pool reaching nothing
	// does not matter here.
	conf := config.Config{}
	conf.Tunnel = config.Tunnel{Enabled: true, Transport: config.TunnelDirect, ManagedServiceAccount: impersonator}
	logs := &fleet.LogBuffer{}
	d, err := fleet.StartDaemon(h.ctx, bin, hubConfig, conf, logs)
	h.must(err)
	t.Cleanup(func() { stop(d, logs) })
	h.must(d.WaitReady(h.ctx, 60*time.Second))

	appCopy := cluster + "-" + app
	secretGone := func(n, name string) error {
		if _, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s/%s still there (%v)", n, name, err)
		}
		return nil
	}
	h.eventually("the other MSA copied, the impersonator's copies removed", func() error {
		for _, n := range ns {
			if _, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, appCopy, metav1.GetOptions{}); err != nil {
				return err
			}
			if err := secretGone(n, copyName); err != nil {
				return err
			}
		}
		return nil
	})
	h.eventually("a Warning Event on the impersonator", func() error {
		evs, err := h.hub.Kube.CoreV1().Events(cluster).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "ManagedServiceAccount" && e.InvolvedObject.Name == impersonator && e.Reason == "ImpersonatorNotCopied" {
				if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "impersonating credential") {
					return fmt.Errorf("event %s: %s", e.Type, e.Message)
				}
				return nil
			}
		}
		return errors.New("not yet")
	})
	h.eventually("the refusal in /metrics", func() error {
		m, err := d.Scrape()
		if err != nil {
			return err
		}
		if got, ok := m.Lookup("hubsync_credential_problems", testutil.Labels{"reason": "impersonator"}); !ok || got != 1 {
			return fmt.Errorf("hubsync_credential_problems{reason=\"impersonator\"} = %v (present %v)", got, ok)
		}
		return nil
	})

	// A rotation of the impersonator's token copies nothing: a rotation
	// of the other MSA, after it, reaching its copies shows the first was
	// handled.
	h.must(h.hub.PutToken(h.ctx, cluster, impersonator, fleet.FakeJWT(exp), nil))
	appTok := fleet.FakeJWT(exp)
	h.must(h.hub.PutToken(h.ctx, cluster, app, appTok, nil))
	h.eventually("the other MSA's rotation", func() error {
		for _, n := range ns {
			sec, err := h.hub.Kube.CoreV1().Secrets(n).Get(h.ctx, appCopy, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if string(sec.Data["token"]) != appTok {
				return fmt.Errorf("%s: not rotated yet", n)
			}
		}
		return nil
	})
	for _, n := range ns {
		h.must(secretGone(n, copyName))
	}

	// Reported once, not on every pass; the pool runs; nothing was refused
	// as an error.
	if n := strings.Count(logs.String(), "refusing to copy the gateway's impersonating credential"); n != 1 {
		t.Errorf("%d warnings about the impersonator in the log, want 1", n)
	}
	if !strings.Contains(logs.String(), "tunnel pool started") {
		t.Errorf("the tunnel pool did not start")
	}
	text, err := d.Metrics()
	h.must(err)
	m, err := testutil.ParseMetrics(text)
	h.must(err)
	for _, r := range []string{"no_token", "invalid_name", "name_conflict"} {
		if got, ok := m.Lookup("hubsync_credential_problems", testutil.Labels{"reason": r}); !ok || got != 0 {
			t.Errorf("hubsync_credential_problems{reason=%q} = %v (present %v), want 0", r, got, ok)
		}
	}
	for _, f := range leak.Tokens(text, h.hub.Tokens()) {
		t.Errorf("%s appears in /metrics", f)
	}
	evs, err := h.hub.Kube.CoreV1().Events("").List(h.ctx, metav1.ListOptions{})
	h.must(err)
	for _, e := range evs.Items {
		for _, f := range leak.Tokens(e.Message, h.hub.Tokens()) {
			t.Errorf("%s appears in Event %s/%s", f, e.Namespace, e.Name)
		}
	}
}
