package fleet

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	msav1beta1 "open-cluster-management.io/managed-serviceaccount/apis/authentication/v1beta1"
)

// OCM's managed-serviceaccount labels.
const (
	LabelIsMSA         = "authentication.open-cluster-management.io/is-managed-serviceaccount"
	LabelSyncToProfile = "authentication.open-cluster-management.io/sync-to-clusterprofile"
)

// FakeJWT returns an unsigned JWT-shaped token with the given expiry and a
// random id, for tests where no API server has to accept it.
func FakeJWT(exp time.Time) string {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	enc := base64.RawURLEncoding
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	claims, _ := json.Marshal(map[string]any{"exp": exp.Unix(), "jti": hex.EncodeToString(id), "sub": "system:serviceaccount:open-cluster-management-agent-addon:test"})
	return enc.EncodeToString(header) + "." + enc.EncodeToString(claims) + "." + enc.EncodeToString(id)
}

// CreateMSA creates a ManagedServiceAccount in the cluster's namespace,
// labelled for syncing into ClusterProfile namespaces when sync is true.
func (h *Hub) CreateMSA(ctx context.Context, cluster, name string, sync bool) (*msav1beta1.ManagedServiceAccount, error) {
	if err := h.Namespace(ctx, cluster); err != nil {
		return nil, err
	}
	msa := &msav1beta1.ManagedServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster},
		Spec: msav1beta1.ManagedServiceAccountSpec{
			Rotation: msav1beta1.ManagedServiceAccountRotation{Enabled: true, Validity: metav1.Duration{Duration: 24 * time.Hour}},
		},
	}
	if sync {
		msa.Labels = map[string]string{LabelSyncToProfile: "true"}
	}
	created, err := h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Create(ctx, msa, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create managed service account %s/%s: %w", cluster, name, err)
	}
	// A token Secret written before the MSA: report it, as the agent would.
	if _, err := h.Kube.CoreV1().Secrets(cluster).Get(ctx, name, metav1.GetOptions{}); err == nil {
		if err := h.ReportTokenSecret(ctx, cluster, name, name); err != nil {
			return nil, err
		}
		return h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Get(ctx, name, metav1.GetOptions{})
	}
	return created, nil
}

// ReportTokenSecret writes the MSA's status.tokenSecretRef as the agent does
// once the token Secret exists; secret "" clears it. A missing MSA is not an
// error: the reference is written when the MSA is created.
func (h *Hub) ReportTokenSecret(ctx context.Context, cluster, msa, secret string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Get(ctx, msa, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if secret == "" {
			m.Status.TokenSecretRef = nil
		} else {
			m.Status.TokenSecretRef = &msav1beta1.SecretRef{Name: secret, LastRefreshTimestamp: metav1.NewTime(time.Now().Truncate(time.Second))}
		}
		_, err = h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).UpdateStatus(ctx, m, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("report token secret of %s/%s: %w", cluster, msa, err)
	}
	return nil
}

// SetMSASync sets or removes the sync-to-clusterprofile label.
func (h *Hub) SetMSASync(ctx context.Context, cluster, name string, sync bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sync {
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[LabelSyncToProfile] = "true"
		} else {
			delete(m.Labels, LabelSyncToProfile)
		}
		_, err = h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Update(ctx, m, metav1.UpdateOptions{})
		return err
	})
}

// SetMSAExpiration writes the MSA's status as the agent does after a
// token refresh.
func (h *Hub) SetMSAExpiration(ctx context.Context, cluster, name string, exp time.Time) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		t := metav1.NewTime(exp.UTC().Truncate(time.Second))
		m.Status.ExpirationTimestamp = &t
		m.Status.TokenSecretRef = &msav1beta1.SecretRef{Name: name, LastRefreshTimestamp: metav1.NewTime(time.Now().Truncate(time.Second))}
		_, err = h.MSA.AuthenticationV1beta1().ManagedServiceAccounts(cluster).UpdateStatus(ctx, m, metav1.UpdateOptions{})
		return err
	})
}

// PutToken creates or replaces the hub token Secret of an MSA, as the
// managed-serviceaccount agent does on every refresh, and reports a new
// Secret in the MSA's status.tokenSecretRef. data overrides the default
// keys (token, ca.crt) when not nil.
func (h *Hub) PutToken(ctx context.Context, cluster, name, token string, data map[string][]byte) error {
	created, err := h.PutTokenSecret(ctx, cluster, name, token, data)
	if err != nil || !created {
		return err
	}
	// Later refreshes rewrite the Secret in place.
	return h.ReportTokenSecret(ctx, cluster, name, name)
}

// PutTokenSecret creates or replaces a labelled token Secret in the
// cluster's namespace without reporting it in any MSA's status, and says
// whether it was created.
func (h *Hub) PutTokenSecret(ctx context.Context, cluster, name, token string, data map[string][]byte) (bool, error) {
	h.NoteToken(token)
	h.NoteToken(string(data["token"]))
	if data == nil {
		data = map[string][]byte{"token": []byte(token), "ca.crt": []byte("-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n")}
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster, Labels: map[string]string{LabelIsMSA: "true"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	created := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := h.Kube.CoreV1().Secrets(cluster).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = h.Kube.CoreV1().Secrets(cluster).Create(ctx, sec, metav1.CreateOptions{})
			created = err == nil
			return err
		}
		if err != nil {
			return err
		}
		cur.Data = sec.Data
		cur.Labels = sec.Labels
		_, err = h.Kube.CoreV1().Secrets(cluster).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	return created, err
}

// PutSecret creates or replaces a Secret's data.
func (h *Hub) PutSecret(ctx context.Context, namespace, name string, data map[string][]byte) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := h.Kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = h.Kube.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: data,
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		cur.Data = data
		_, err = h.Kube.CoreV1().Secrets(namespace).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}
