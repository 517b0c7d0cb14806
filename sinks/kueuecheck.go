package sinks

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/hubsync/hubsync/config"
)

// ErrKueueRefuses is wrapped by the errors of CheckKueueKubeconfig.
var ErrKueueRefuses = errors.New("kubeconfig refused by Kueue's MultiKueue rules")

// CheckKueueKubeconfig applies the rules Kueue's MultiKueue (v0.19) sets
// for every kubeconfig it reads from a Secret or a file; a MultiKueueCluster
// whose kubeconfig breaks one stays inactive with reason
// InsecureKubeConfig. Every cluster must have a server whose host is an IP
// address or a DNS-1123 name (config.CheckKueueServer), verify TLS, and
// carry its CA as certificate-authority-data rather than a file; no user
// may read a token file, use basic auth, run an exec plugin or use an auth
// provider (an inline token is allowed); and the current context must name
// a cluster and a user that exist. It checks every cluster and user, not
// only the current context's as Kueue does, so a file it passes passes
// Kueue. The error lists every broken rule and never quotes a credential.
func CheckKueueKubeconfig(cfg *clientcmdapi.Config) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		c := cfg.Clusters[name]
		if c.InsecureSkipTLSVerify {
			errs = append(errs, fmt.Errorf("cluster %s: insecure-skip-tls-verify is set", name))
		}
		if c.CertificateAuthority != "" {
			errs = append(errs, fmt.Errorf("cluster %s: its CA is a file (certificate-authority), not certificate-authority-data", name))
		}
		if err := config.CheckKueueServer(c.Server); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		a := cfg.AuthInfos[name]
		for _, bad := range []struct {
			set  bool
			what string
		}{
			{a.TokenFile != "", "reads a token file"},
			{a.Username != "" || a.Password != "", "uses basic auth"},
			{a.Exec != nil, "runs an exec plugin"},
			{a.AuthProvider != nil, "uses an auth provider"},
		} {
			if bad.set {
				errs = append(errs, fmt.Errorf("user %s %s", name, bad.what))
			}
		}
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	switch {
	case ctx == nil:
		errs = append(errs, fmt.Errorf("the current context %q does not exist", cfg.CurrentContext))
	case cfg.Clusters[ctx.Cluster] == nil || cfg.AuthInfos[ctx.AuthInfo] == nil:
		errs = append(errs, fmt.Errorf("the current context %q names a cluster or user that does not exist", cfg.CurrentContext))
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return fmt.Errorf("%w: %s", ErrKueueRefuses, strings.Join(msgs, "; "))
}
