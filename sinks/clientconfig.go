package sinks

import (
	"encoding/json"
	"errors"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
)

// EncodeKubeconfig encodes cfg as a v1 kubeconfig in JSON: every kubeconfig
// reader (client-go's clientcmd, kubectl, Kueue) takes JSON as well as
// YAML, and JSON costs a fraction of the YAML conversion, which dominated
// the kubeconfig sink's CPU time with thousands of files. The conversion to
// v1 sorts maps and extensions into lists, so equal configurations give
// equal bytes, which is what lets sinks skip writes that would change
// nothing. The error never quotes the configuration, which may hold a
// token.
func EncodeKubeconfig(cfg *clientcmdapi.Config) ([]byte, error) {
	v1cfg := &clientcmdv1.Config{}
	if err := clientcmdlatest.Scheme.Convert(cfg, v1cfg, nil); err != nil {
		return nil, errors.New("convert the kubeconfig to v1 failed")
	}
	v1cfg.APIVersion, v1cfg.Kind = "v1", "Config"
	data, err := json.MarshalIndent(v1cfg, "", "  ")
	if err != nil {
		return nil, errors.New("encode the kubeconfig failed")
	}
	return data, nil
}
