package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

const (
	proxyNamespace = "open-cluster-management-addon"
	proxyCASecret  = "cluster-proxy-user-serving-cert"
	demoMSA        = "kueue"
)

func putProxyCA(ctx context.Context, fh *fleet.Hub, ca string) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: proxyCASecret, Namespace: proxyNamespace},
		Data:       map[string][]byte{"tls.crt": []byte(ca)},
	}
	_, err := fh.Kube.CoreV1().Secrets(proxyNamespace).Update(ctx, s, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = fh.Kube.CoreV1().Secrets(proxyNamespace).Create(ctx, s, metav1.CreateOptions{})
	}
	return err
}

// demoCredentials shows the access provider's CA rotation and the copies
// of ManagedServiceAccount tokens through a rotation and a label removal.
func demoCredentials(ctx context.Context, fh *fleet.Hub, m *model, tail *eventTail) error {
	step("Access provider: every profile carries cluster-proxy's server and CA; rotate the CA Secret")
	t0 := time.Now()
	if err := putProxyCA(ctx, fh, "demo-proxy-ca-2"); err != nil {
		return err
	}
	n, err := waitFor(ctx, func() (int, bool, error) {
		count, all := 0, true
		for ns := range m.bindings {
			ps, err := fh.ProfilesIn(ctx, ns)
			if err != nil {
				return 0, false, err
			}
			for _, p := range ps {
				count++
				ok := false
				for _, a := range p.Status.AccessProviders {
					ok = ok || (a.Name == "open-cluster-management" && string(a.Cluster.CertificateAuthorityData) == "demo-proxy-ca-2")
				}
				all = all && ok
			}
		}
		return count, all, nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("   all %d profiles carry the new CA %s after the Secret changed (cluster-proxy itself never notices)\n", n, since(t0))
	tail.flush(4)

	step("Credentials: ManagedServiceAccount \"" + demoMSA + "\" on three clusters, labelled sync-to-clusterprofile")
	clusters := []string{"eu-prod-04", "us-prod-04", "staging-04"}
	exp := time.Now().Add(24 * time.Hour)
	tokens := map[string]string{}
	t0 = time.Now()
	for _, c := range clusters {
		if _, err := fh.CreateMSA(ctx, c, demoMSA, true); err != nil {
			return err
		}
		tokens[c] = fleet.FakeJWT(exp)
		if err := fh.PutToken(ctx, c, demoMSA, tokens[c], nil); err != nil {
			return err
		}
	}
	want := func() map[string]string { // "ns/secret" -> fingerprint
		out := map[string]string{}
		for ns, names := range m.expected() {
			for _, c := range names {
				if t, ok := tokens[c]; ok {
					out[ns+"/"+c+"-"+demoMSA] = hub.TokenFingerprint([]byte(t))
				}
			}
		}
		return out
	}
	if err := waitCopies(ctx, fh, m, want()); err != nil {
		return err
	}
	fmt.Printf("   copies in place %s after the MSAs were created\n", since(t0))
	tail.flush(4)
	fmt.Println()
	if err := printCopies(ctx, fh, m); err != nil {
		return err
	}

	step("Credentials: the agent rotates eu-prod-04's token")
	tokens["eu-prod-04"] = fleet.FakeJWT(exp.Add(time.Hour))
	t0 = time.Now()
	if err := fh.PutToken(ctx, "eu-prod-04", demoMSA, tokens["eu-prod-04"], nil); err != nil {
		return err
	}
	if err := waitCopies(ctx, fh, m, want()); err != nil {
		return err
	}
	fmt.Printf("   every copy of eu-prod-04-%s now holds %s, %s after the rotation (a CredentialRotated Event records it)\n",
		demoMSA, hub.TokenFingerprint([]byte(tokens["eu-prod-04"])), since(t0))
	tail.flush(8)

	step("Credentials: remove the sync label from staging-04's MSA")
	delete(tokens, "staging-04")
	t0 = time.Now()
	if err := fh.SetMSASync(ctx, "staging-04", demoMSA, false); err != nil {
		return err
	}
	if err := waitCopies(ctx, fh, m, want()); err != nil {
		return err
	}
	fmt.Printf("   its copies are gone %s later (the upstream syncer would leave them behind)\n", since(t0))
	tail.flush(8)
	return nil
}

// waitFor polls check until it reports done, returning its count.
func waitFor(ctx context.Context, check func() (int, bool, error)) (int, error) {
	var n int
	err := testutil.Poll(ctx, 60*time.Second, 10*time.Millisecond, func() error {
		var done bool
		var err error
		if n, done, err = check(); err != nil {
			return testutil.Stop(err)
		}
		if !done {
			return fmt.Errorf("not converged (%d)", n)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// waitCopies waits until the demo namespaces hold exactly the wanted
// copies with the wanted fingerprints.
func waitCopies(ctx context.Context, fh *fleet.Hub, m *model, want map[string]string) error {
	_, err := waitFor(ctx, func() (int, bool, error) {
		got := map[string]string{}
		for ns := range m.bindings {
			list, err := fh.Kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: hub.LabelSyncedFrom})
			if err != nil {
				return 0, false, err
			}
			for _, s := range list.Items {
				got[ns+"/"+s.Name] = s.Annotations[hub.AnnotationTokenFingerprint]
			}
		}
		if len(got) != len(want) {
			return len(got), false, nil
		}
		for k, v := range want {
			if got[k] != v {
				return len(got), false, nil
			}
		}
		return len(got), true, nil
	})
	return err
}

func printCopies(ctx context.Context, fh *fleet.Hub, m *model) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "   NAMESPACE\tSECRET\tSYNCED-FROM\tFINGERPRINT\tEXPIRES\tOWNER")
	var rows []string
	for ns := range m.bindings {
		list, err := fh.Kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: hub.LabelSyncedFrom})
		if err != nil {
			return err
		}
		for _, s := range list.Items {
			owner := ""
			if len(s.OwnerReferences) > 0 {
				owner = s.OwnerReferences[0].Kind + "/" + s.OwnerReferences[0].Name
			}
			rows = append(rows, fmt.Sprintf("   %s\t%s\t%s\t%s\t%s\t%s", ns, s.Name, s.Labels[hub.LabelSyncedFrom],
				s.Annotations[hub.AnnotationTokenFingerprint], s.Annotations[hub.AnnotationTokenExpiration], owner))
		}
	}
	sort.Strings(rows)
	fmt.Fprintln(tw, strings.Join(rows, "\n"))
	return tw.Flush()
}
