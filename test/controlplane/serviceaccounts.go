package controlplane

import (
	"context"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// CredentialIDExtra is the user-info extra in which kube-apiserver reports
// the credential a request authenticated with: "JTI=<jti>" for a
// ServiceAccount token.
const CredentialIDExtra = "authentication.kubernetes.io/credential-id"

// CredentialJTI returns the JTI of the ServiceAccount token that user-info
// extra (a SelfSubjectReview's, an audit event's) says a request
// authenticated with, or "" when it names none.
func CredentialJTI[V ~[]string](extra map[string]V) string {
	for _, v := range extra[CredentialIDExtra] {
		if jti, ok := strings.CutPrefix(v, "JTI="); ok {
			return jti
		}
	}
	return ""
}

// BoundToken is a ServiceAccount token bound to a Secret of its own in
// the ServiceAccount's namespace: deleting the Secret revokes the token,
// the way a real rotation retires the old one.
type BoundToken struct {
	// Namespace and ServiceAccount name the token's ServiceAccount.
	Namespace, ServiceAccount string
	// Secret is the name of the Secret the token is bound to.
	Secret string
	Token  string
	// JTI is the token's jti claim, which kube-apiserver reports as the
	// credential of the requests made with it (CredentialJTI).
	JTI string
}

// CreateServiceAccount creates namespace and the ServiceAccount name in
// it, each unless it exists, on the API server that admin reaches.
func CreateServiceAccount(ctx context.Context, admin *rest.Config, namespace, name string) error {
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s on %s: %w", namespace, admin.Host, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := kube.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/%s on %s: %w", namespace, name, admin.Host, err)
	}
	return nil
}

// MintBoundToken creates the Secret namespace/secret on the API server
// that admin reaches and returns a new token of the ServiceAccount
// namespace/sa, valid for ttl (TokenRequest's least is ten minutes) and
// bound to that Secret.
func MintBoundToken(ctx context.Context, admin *rest.Config, namespace, sa, secret string, ttl time.Duration) (BoundToken, error) {
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return BoundToken{}, err
	}
	sec, err := kube.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret}}, metav1.CreateOptions{})
	if err != nil {
		return BoundToken{}, fmt.Errorf("create the token's Secret %s/%s on %s: %w", namespace, secret, admin.Host, err)
	}
	secs := int64(ttl.Seconds())
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: sec.Name, UID: sec.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return BoundToken{}, fmt.Errorf("request token %s of %s/%s on %s: %w", secret, namespace, sa, admin.Host, err)
	}
	jti, err := pki.JWTID(tr.Status.Token)
	if err != nil {
		return BoundToken{}, fmt.Errorf("token %s: %w", secret, err)
	}
	return BoundToken{Namespace: namespace, ServiceAccount: sa, Secret: secret, Token: tr.Status.Token, JTI: jti}, nil
}

// revocationPoll is how often RevokeBoundToken asks whether the token is
// refused; the rotation benchmark reports the wait, so it is kept short.
const revocationPoll = 50 * time.Millisecond

// RevokeBoundToken deletes the Secret tok is bound to and waits, at most
// within, until the API server that admin reaches refuses tok. That is
// not at once: kube-apiserver caches a successful token authentication
// for about 10 s, so the refusal is polled for, not assumed. It returns
// how long after the deletion the refusal was first seen.
func RevokeBoundToken(ctx context.Context, admin *rest.Config, tok BoundToken, within time.Duration) (time.Duration, error) {
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return 0, err
	}
	// The probe carries nothing but the token; /version is open to every
	// authenticated user, so only the authentication decides its answer.
	probe, err := kubernetes.NewForConfig(&rest.Config{
		Host: admin.Host, BearerToken: tok.Token, UserAgent: "revocation-probe",
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData},
	})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := kube.CoreV1().Secrets(tok.Namespace).Delete(ctx, tok.Secret, metav1.DeleteOptions{}); err != nil {
		return 0, fmt.Errorf("revoke token %s on %s: %w", tok.Secret, admin.Host, err)
	}
	err = testutil.Poll(ctx, within, revocationPoll, func() error {
		err := probe.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		if apierrors.IsUnauthorized(err) {
			return nil
		}
		return fmt.Errorf("token %s still accepted (%v)", tok.Secret, err)
	})
	if err != nil {
		return 0, fmt.Errorf("revoked token %s not refused by %s: %w", tok.Secret, admin.Host, err)
	}
	return time.Since(start), nil
}
