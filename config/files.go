package config

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// fileRef is a file the configuration names, with its field path.
type fileRef struct {
	path *field.Path
	file string
	// nonEmpty refuses a file holding only white space (a token).
	nonEmpty bool
}

// checkFiles reports the files the configuration names that hubsync
// cannot read. It runs where the daemon runs (Parse), apart from
// Validate, which reads nothing: a command run elsewhere (hubsync
// kubeconfig) validates the same file without having its certificates.
func (c *Config) checkFiles() field.ErrorList {
	var errs field.ErrorList
	for _, f := range c.files() {
		if f.file == "" {
			continue
		}
		data, err := os.ReadFile(f.file)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(f.path, f.file, fmt.Sprintf("cannot read: %v", err)))
		case f.nonEmpty && strings.TrimSpace(string(data)) == "":
			errs = append(errs, field.Invalid(f.path, f.file, "is empty"))
		}
	}
	return errs
}

// files lists the files the configuration names, with their field paths:
// the embedded server's only when it runs, the gateway's only when it is
// on.
func (c *Config) files() []fileRef {
	ref := func(p *field.Path, file string) fileRef { return fileRef{path: p, file: file} }
	out := []fileRef{ref(field.NewPath("hub", "kubeconfig"), c.Hub.Kubeconfig)}
	for i, p := range c.AccessProviders {
		if p.Type == ProviderServer || p.Type == ProviderGateway {
			out = append(out, ref(field.NewPath("accessProviders").Index(i).Child("caFile"), p.CAFile))
		}
	}
	b, bp := c.Bus, field.NewPath("bus")
	out = append(out,
		ref(bp.Child("credsFile"), b.CredsFile),
		ref(bp.Child("nkeySeedFile"), b.NKeySeedFile),
		ref(bp.Child("tls", "caFile"), b.TLS.CAFile),
		ref(bp.Child("tls", "certFile"), b.TLS.CertFile),
		ref(bp.Child("tls", "keyFile"), b.TLS.KeyFile))
	if e, ep := b.Embedded, bp.Child("embedded"); len(b.URLs) == 0 {
		out = append(out,
			ref(ep.Child("tls", "certFile"), e.TLS.CertFile),
			ref(ep.Child("tls", "keyFile"), e.TLS.KeyFile),
			ref(ep.Child("tls", "clientCAFile"), e.TLS.ClientCAFile),
			fileRef{path: ep.Child("authTokenFile"), file: e.AuthTokenFile, nonEmpty: true},
			ref(ep.Child("cluster", "tls", "certFile"), e.Cluster.TLS.CertFile),
			ref(ep.Child("cluster", "tls", "keyFile"), e.Cluster.TLS.KeyFile),
			ref(ep.Child("cluster", "tls", "caFile"), e.Cluster.TLS.CAFile))
	}
	if g, tp := c.Gateway, field.NewPath("gateway", "tls"); g.Enabled {
		out = append(out,
			ref(tp.Child("certFile"), g.TLS.CertFile),
			ref(tp.Child("keyFile"), g.TLS.KeyFile),
			ref(tp.Child("caFile"), g.TLS.CAFile))
	}
	for i, s := range c.Sinks {
		if w := s.Webhook; w != nil && s.Type == SinkWebhook {
			wp := field.NewPath("sinks").Index(i).Child("webhook")
			out = append(out,
				ref(wp.Child("secretsFile"), w.SecretsFile),
				ref(wp.Child("bearerTokenFile"), w.BearerTokenFile),
				ref(wp.Child("caFile"), w.CAFile))
		}
	}
	return out
}
