package kubeconfig

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/stream"
)

const (
	// MarkerKey is the extension of the kubeconfig's top-level
	// extensions list that marks a file as written by hubsync. Its value
	// is {"sink": "<sink name>"}.
	MarkerKey = "hubsync.io/managed-by"
	// execAPIVersion is the ExecCredential version the plugin speaks.
	execAPIVersion = "client.authentication.k8s.io/v1"
)

// marker is the value of MarkerKey.
type marker struct {
	Sink string `json:"sink"`
}

// content describes one file: everything its bytes depend on.
type content struct {
	sink      string
	key       stream.Key
	provider  stream.AccessProviderSummary
	msa       string
	exec      *clientcmdapi.ExecConfig // exec mode
	token     string                   // token mode
	tokenMode bool
	// kueue checks the file against Kueue's rules (consumer: kueue): a
	// file Kueue would refuse is an error wrapping sinks.ErrKueueRefuses.
	kueue bool
}

// render encodes c as a kubeconfig with sinks.EncodeKubeconfig (JSON, equal
// contents giving equal bytes).
func render(c content) ([]byte, error) {
	cluster := c.key.Cluster
	user := hub.CopyName(cluster, c.msa)

	execExt := &runtime.Unknown{Raw: hub.ExecClusterConfigJSON(cluster), ContentType: runtime.ContentTypeJSON}
	mark, err := unknown(marker{Sink: c.sink})
	if err != nil {
		return nil, err
	}

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   c.provider.Server,
		CertificateAuthorityData: c.provider.CAData,
		Extensions:               map[string]runtime.Object{hub.ExecExtensionKey: execExt},
	}
	auth := &clientcmdapi.AuthInfo{}
	if c.tokenMode {
		auth.Token = c.token
	} else {
		auth.Exec = c.exec
	}
	cfg.AuthInfos[user] = auth
	cfg.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = cluster
	cfg.Extensions[MarkerKey] = mark
	if c.kueue {
		if err := sinks.CheckKueueKubeconfig(cfg); err != nil {
			return nil, err
		}
	}
	data, err := sinks.EncodeKubeconfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of %s/%s: %w", c.key.Namespace, cluster, err)
	}
	return data, nil
}

// execConfig is the exec plugin stanza of every exec-mode file: `hubsync
// creds` with every name in its arguments, so it needs nothing from its
// environment, yet with the cluster info for plugins that want it.
func execConfig(cfg execSettings, key stream.Key, msa string) *clientcmdapi.ExecConfig {
	return &clientcmdapi.ExecConfig{
		APIVersion:         execAPIVersion,
		Command:            cfg.command,
		Args:               sinks.CredsArgs(msa, key.Cluster, key.Namespace),
		InstallHint:        cfg.installHint,
		ProvideClusterInfo: true,
		InteractiveMode:    clientcmdapi.NeverExecInteractiveMode,
	}
}

// execSettings are the exec plugin's configured command and hint.
type execSettings struct {
	command, installHint string
}

// unknown wraps v as the raw JSON object clientcmd writes as an extension.
func unknown(v any) (*runtime.Unknown, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode kubeconfig extension: %w", err)
	}
	return &runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeJSON}, nil
}

// markerOf returns the sink name a kubeconfig's marker holds, and whether
// data is a kubeconfig carrying a hubsync marker at all. Parse errors are
// not returned: they may quote the file, and the file may hold a token.
func markerOf(data []byte) (string, bool) {
	cfg, err := clientcmd.Load(data)
	if err != nil || cfg == nil {
		return "", false
	}
	ext, ok := cfg.Extensions[MarkerKey]
	if !ok {
		return "", false
	}
	var raw []byte
	switch e := ext.(type) {
	case *runtime.Unknown:
		raw = e.Raw
	default:
		return "", false
	}
	var m marker
	if err := json.Unmarshal(raw, &m); err != nil || m.Sink == "" {
		return "", false
	}
	return m.Sink, true
}
