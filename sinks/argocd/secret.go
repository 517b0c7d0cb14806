package argocd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
)

// Labels and values of the Secrets the sink writes.
const (
	// LabelSecretType is the label Argo CD selects its cluster Secrets by.
	LabelSecretType = "argocd.argoproj.io/secret-type"
	// SecretTypeCluster is its value for a cluster Secret.
	SecretTypeCluster = "cluster"
	// LabelManagedBy and ManagedBy mark a Secret as hubsync's.
	LabelManagedBy = hub.LabelManagedBy
	ManagedBy      = hub.ManagedBy
	// LabelSink names the sink that wrote a Secret: a Secret is the sink's
	// only when it carries both LabelManagedBy and this label.
	LabelSink = hub.LabelSink
	// LabelClusterName is the cluster's name, or a shortened form with a
	// hash when the name is longer than a label value may be.
	LabelClusterName = hub.LabelClusterName

	// AnnotationRefresh is what Argo CD writes on a cluster Secret when a
	// user asks it to invalidate the cluster's cache. The sink leaves it as
	// it is: removing it would be a write that serves nobody.
	AnnotationRefresh = "argocd.argoproj.io/refresh"

	// ExecAPIVersion is the ExecCredential version `hubsync creds` answers in.
	ExecAPIVersion = "client.authentication.k8s.io/v1"

	// maxNameLength is the longest a Secret name (a DNS-1123 subdomain) may be.
	maxNameLength = 253
	// hashLength is how many hex digits of a hash shortened names keep.
	hashLength = 10
)

// SecretName returns the name of the Secret sink writes for cluster:
// "hubsync-<sink>-<cluster>". A name longer than a Secret name may be is
// cut and suffixed with a hash of the cluster name, so it stays unique and
// is the same on every run.
func SecretName(sink, cluster string) string {
	name := "hubsync-" + sink + "-" + cluster
	if len(name) <= maxNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(cluster))
	// A cut name must still end in an alphanumeric character.
	prefix := strings.TrimRight(name[:maxNameLength-hashLength-1], "-.")
	return prefix + "-" + hex.EncodeToString(sum[:])[:hashLength]
}

// clusterConfig is the "config" of an Argo CD cluster Secret. Its fields
// are those of Argo CD's ClusterConfig (pkg/apis/application/v1alpha1), in
// the same order and with the same JSON options, so a Secret Argo CD
// rewrites (its UI or CLI re-encode the config) reads the same bytes and
// the sink does not write it back, which would drop Argo CD's cache of the
// cluster.
type clusterConfig struct {
	BearerToken        string              `json:"bearerToken,omitempty"`
	TLSClientConfig    tlsClientConfig     `json:"tlsClientConfig"`
	ExecProviderConfig *execProviderConfig `json:"execProviderConfig,omitempty"`
}

type tlsClientConfig struct {
	Insecure bool `json:"insecure"`
	// CAData is PEM; encoding/json writes it as base64, as Argo CD reads it.
	CAData []byte `json:"caData,omitempty"`
}

// execProviderConfig is Argo CD's ExecProviderConfig. ProvideClusterInfo
// and Config are Argo CD 3.5's; 3.2 reads past them, but its UI or CLI
// would drop them on a save, so they are written only when configured.
type execProviderConfig struct {
	Command            string            `json:"command,omitempty"`
	Args               []string          `json:"args,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	APIVersion         string            `json:"apiVersion,omitempty"`
	InstallHint        string            `json:"installHint,omitempty"`
	ProvideClusterInfo bool              `json:"provideClusterInfo,omitempty"`
	// Config becomes the plugin's spec.cluster.config in
	// KUBERNETES_EXEC_INFO.
	Config json.RawMessage `json:"config,omitempty"`
}

// cpCredsNamespaceEnv names the namespace cp-creds reads the credential
// copy from; without it, cp-creds would look in Argo CD's own namespace.
const cpCredsNamespaceEnv = "NAMESPACE"

// clusterSecret is what the sink knows of one cluster when it renders its
// Secret. token is set in token mode only.
type clusterSecret struct {
	cluster string
	server  string
	caData  []byte
	token   string
}

// render returns the Secret the sink wants for c.
func (s *Sink) render(c clusterSecret) (*corev1.Secret, error) {
	cfg := clusterConfig{TLSClientConfig: tlsClientConfig{CAData: c.caData}}
	if s.tokenMode() {
		cfg.BearerToken = c.token
	} else {
		cfg.ExecProviderConfig = s.execConfig(c.cluster)
	}
	encoded, err := json.Marshal(cfg)
	if err != nil {
		// Strings and bytes do not fail to encode; the error is not quoted
		// in case it held the token.
		return nil, fmt.Errorf("encode the cluster config of %s failed", c.cluster)
	}
	data := map[string][]byte{
		"name":   []byte(c.cluster),
		"server": []byte(c.server),
		"config": encoded,
	}
	if len(s.cfg.Namespaces) > 0 {
		data["namespaces"] = []byte(strings.Join(s.cfg.Namespaces, ","))
		// Argo CD looks at clusterResources only for a cluster limited to
		// namespaces (gitops-engine's cluster cache: "len(namespaces) == 0
		// || clusterResources"); without namespaces it manages cluster
		// resources anyway, so the key would only be noise.
		if s.cfg.ClusterResources {
			data["clusterResources"] = []byte("true")
		}
	}
	if s.cfg.Project != "" {
		data["project"] = []byte(s.cfg.Project)
	}
	if s.cfg.Shard != "" {
		data["shard"] = []byte(s.cfg.Shard)
	}
	labels := maps.Clone(s.cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	// The sink's own labels win over configured ones of the same key: they
	// are how it recognises its Secrets and how Argo CD finds them.
	labels[LabelSecretType] = SecretTypeCluster
	labels[LabelManagedBy] = ManagedBy
	labels[LabelSink] = s.name
	labels[LabelClusterName] = hub.ClusterNameLabelValue(c.cluster)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        SecretName(s.name, c.cluster),
			Namespace:   s.cfg.Namespace,
			Labels:      labels,
			Annotations: maps.Clone(s.cfg.Annotations),
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}, nil
}

// execConfig is the exec plugin stanza of cluster's Secret. By default it
// runs `hubsync creds` with the cluster in its arguments, which every Argo
// CD version passes on. With provideClusterInfo it names no cluster in
// the arguments: Argo CD 3.5 and later hand the plugin the config below in
// KUBERNETES_EXEC_INFO, as client-go does for a kubeconfig, so the same
// stanza suits `hubsync creds` and managed-serviceaccount's cp-creds.
func (s *Sink) execConfig(cluster string) *execProviderConfig {
	e := &execProviderConfig{Command: s.cfg.Exec.Command, APIVersion: ExecAPIVersion, InstallHint: s.cfg.Exec.InstallHint}
	if !s.cfg.ProvideClusterInfo {
		e.Args = s.credsArgs(cluster)
		return e
	}
	// The config is hub.ExecClusterConfig, as in a ClusterProfile's
	// hub.ExecExtensionKey extension.
	e.ProvideClusterInfo, e.Config = true, hub.ExecClusterConfigJSON(cluster)
	msa, ns := s.cfg.ManagedServiceAccount, s.cfg.ConsumerNamespace
	if s.cfg.ExecPlugin == config.ExecPluginCPCreds {
		// cp-creds takes one flag and finds the copy's namespace in its
		// environment.
		e.Args = []string{"--managed-serviceaccount=" + msa}
		e.Env = map[string]string{cpCredsNamespaceEnv: ns}
	} else {
		e.Args = sinks.ClusterInfoCredsArgs(msa, ns)
	}
	return e
}

// owned reports whether sec is one of sink's Secrets.
func owned(sec *corev1.Secret, sink string) bool {
	return sec.Labels[LabelManagedBy] == ManagedBy && sec.Labels[LabelSink] == sink
}

// upToDate reports whether cur already holds what want says: the same
// data, labels and annotations, leaving out the annotations Argo CD keeps
// on the Secret.
func upToDate(cur, want *corev1.Secret) bool {
	return maps.EqualFunc(cur.Data, want.Data, bytes.Equal) &&
		maps.Equal(cur.Labels, want.Labels) &&
		maps.Equal(foreignAnnotationsRemoved(cur.Annotations), want.Annotations)
}

// foreignAnnotationsRemoved returns a without the annotations Argo CD
// writes on cluster Secrets.
func foreignAnnotationsRemoved(a map[string]string) map[string]string {
	if _, ok := a[AnnotationRefresh]; !ok {
		return a
	}
	out := maps.Clone(a)
	delete(out, AnnotationRefresh)
	return out
}

// updated returns cur with want's content, keeping cur's identity and
// resource version (so the update fails if cur changed meanwhile) and the
// annotations Argo CD writes.
func updated(cur, want *corev1.Secret) *corev1.Secret {
	out := cur.DeepCopy()
	out.Data = want.Data
	out.StringData = nil
	out.Labels = maps.Clone(want.Labels)
	out.Annotations = maps.Clone(want.Annotations)
	if v, ok := cur.Annotations[AnnotationRefresh]; ok {
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[AnnotationRefresh] = v
	}
	return out
}

// trimServer returns server as Argo CD keys clusters by it: without a
// trailing slash.
func trimServer(server string) string {
	return strings.TrimRight(server, "/")
}
