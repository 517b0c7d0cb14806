package controlplane

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubectlPath returns the kubectl that test/tools/build-kube-binaries.sh
// builds next to kube-apiserver (same Kubernetes version), in AssetsDir.
func KubectlPath() (string, error) {
	dir, err := AssetsDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubectl")
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("no kubectl in %s: run `bash test/tools/build-kube-binaries.sh` (it adds kubectl to an existing directory) and point KUBEBUILDER_ASSETS at the directory it prints", dir)
	case err != nil:
		return "", fmt.Errorf("kubectl: %w", err)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	return path, nil
}

// WriteKubeconfig writes a kubeconfig for cfg (server, CA and bearer token
// or client certificate, inline) to dir/name and returns its path. Its one
// context, "default", is the current context.
func WriteKubeconfig(dir, name string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["default"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		CertificateAuthority:     cfg.CAFile,
		InsecureSkipTLSVerify:    cfg.Insecure,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos["default"] = &clientcmdapi.AuthInfo{
		Token:                 cfg.BearerToken,
		TokenFile:             cfg.BearerTokenFile,
		ClientCertificateData: cfg.CertData,
		ClientCertificate:     cfg.CertFile,
		ClientKeyData:         cfg.KeyData,
		ClientKey:             cfg.KeyFile,
	}
	kc.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	kc.CurrentContext = "default"
	path := filepath.Join(dir, name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}
