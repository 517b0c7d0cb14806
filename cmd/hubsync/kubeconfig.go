package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	cpclient "sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/sinks"
)

// hubsync kubeconfig writes a kubeconfig that reaches one managed cluster
// through hubsync's access gateway: what `clusteradm proxy kubectl --sa`
// does, but the file is 0600, written atomically, and verifies the
// gateway's certificate. The user authenticates with their hub identity
// (the exec plugin `hubsync hub-token` hands client-go the bearer token of
// their hub kubeconfig, and the gateway impersonates them as
// cluster:hub:<user>), or with --sa as a ManagedServiceAccount of the
// cluster (the exec plugin `hubsync creds` reads its token copy).

type kubeconfigOptions struct {
	cluster, gatewayURL, caFile, configFile string
	// fromProfile: the namespace whose ClusterProfile of the cluster names
	// the gateway (the server and CA of its --provider access provider).
	fromProfile, provider string
	// server and caData are what the profile named.
	server                    string
	caData                    []byte
	sa, saNamespace           string
	hubKubeconfig, hubContext string
	output, command           string
}

func kubeconfigCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &kubeconfigOptions{}
	fs := flag.NewFlagSet("kubeconfig", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cluster, "cluster", "", "the managed cluster to reach (required)")
	fs.StringVar(&o.gatewayURL, "gateway", "", "the gateway's URL (default: gateway.url of --config)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM bundle that verifies the gateway (default: gateway.tls.caFile of --config; none: the system's roots)")
	fs.StringVar(&o.configFile, "config", "", "hubsync's configuration file, for the gateway's URL and CA")
	fs.StringVar(&o.fromProfile, "from-profile", "", "read the gateway's URL and CA from the cluster's ClusterProfile in this namespace of the hub (its --provider access provider)")
	fs.StringVar(&o.provider, "provider", "hubsync-gateway", "with --from-profile: the name of the gateway's access provider")
	fs.StringVar(&o.sa, "sa", "", "act as this ManagedServiceAccount of the cluster instead of your hub identity")
	fs.StringVar(&o.saNamespace, "namespace", "", "with --sa: the namespace holding the token copy <cluster>-<sa> (default: hubsync creds' default)")
	fs.StringVar(&o.hubKubeconfig, "hub-kubeconfig", "", "the hub kubeconfig whose identity to use (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&o.hubContext, "hub-context", "", "the context of --hub-kubeconfig (default: its current context)")
	fs.StringVar(&o.output, "o", "", "file to write, mode 0600 (default <cluster>.kubeconfig; - for stdout)")
	fs.StringVar(&o.command, "exec-command", "", "the hubsync binary the kubeconfig runs (default: this one, by absolute path)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync kubeconfig --cluster=C [--gateway=URL] [--ca-file=F | --config=F] [--sa=M [--namespace=NS]] [-o FILE]")
		fmt.Fprintln(stderr, "\nWrites a kubeconfig (0600, TLS verified) that reaches cluster C through hubsync's gateway,")
		fmt.Fprintln(stderr, "as your hub identity (impersonated there as cluster:hub:<user>) or, with --sa, as a")
		fmt.Fprintln(stderr, "ManagedServiceAccount of C.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := o.complete(fs); err != nil {
		fmt.Fprintf(stderr, "hubsync kubeconfig: %v\n", err)
		fs.Usage()
		return errUsage
	}
	if o.fromProfile != "" {
		if err := o.readProfile(ctx); err != nil {
			return err
		}
	}
	data, err := o.build()
	if err != nil {
		return err
	}
	if o.output == "-" {
		_, err := stdout.Write(data)
		return err
	}
	if err := sinks.WriteFileAtomic(o.output, data); err != nil {
		return fmt.Errorf("writing %s: %w", o.output, err)
	}
	fmt.Fprintf(stderr, "wrote %s: kubectl --kubeconfig %s get ns\n", o.output, o.output)
	return nil
}

// complete checks the flags and fills in the defaults.
func (o *kubeconfigOptions) complete(fs *flag.FlagSet) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if o.cluster == "" {
		return errors.New("--cluster is required")
	}
	if msgs := validation.IsDNS1123Subdomain(o.cluster); len(msgs) > 0 {
		return fmt.Errorf("--cluster %q is not a cluster name: %s", o.cluster, strings.Join(msgs, "; "))
	}
	if o.sa != "" && len(validation.IsDNS1123Subdomain(o.sa)) > 0 {
		return fmt.Errorf("--sa %q is not a ManagedServiceAccount name", o.sa)
	}
	if o.saNamespace != "" && o.sa == "" {
		return errors.New("--namespace goes with --sa")
	}
	if o.configFile != "" {
		// The file is validated as the daemon would, but its files (the
		// gateway's key, the hub kubeconfig) are not read: they need not
		// exist where this runs.
		data, err := os.ReadFile(o.configFile)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		cfg, err := config.Decode(data)
		if err != nil {
			return fmt.Errorf("--config %s: %w", o.configFile, err)
		}
		if o.gatewayURL == "" {
			o.gatewayURL = cfg.Gateway.URL
		}
		if o.caFile == "" {
			o.caFile = cfg.Gateway.TLS.CAFile
		}
	}
	var err error
	switch {
	case o.fromProfile != "" && (o.gatewayURL != "" || o.caFile != "" || o.configFile != ""):
		return errors.New("--from-profile reads the gateway's URL and CA from the profile: not with --gateway, --ca-file or --config")
	case o.fromProfile != "":
	case o.gatewayURL == "":
		return errors.New("the gateway's URL: --gateway, --config with gateway.url, or --from-profile NAMESPACE")
	default:
		u, err := url.Parse(o.gatewayURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("--gateway %q must be an https:// URL", o.gatewayURL)
		}
	}
	if o.output == "" {
		o.output = o.cluster + ".kubeconfig"
	}
	if o.command == "" {
		if o.command, err = os.Executable(); err != nil {
			return fmt.Errorf("cannot find this binary for the exec plugin (use --exec-command): %w", err)
		}
	}
	if o.sa == "" && o.hubKubeconfig == "" {
		// Record where the hub identity comes from now, so the file works
		// from any directory and environment.
		if k := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); k != "" {
			o.hubKubeconfig = filepath.SplitList(k)[0]
		} else {
			o.hubKubeconfig = clientcmd.RecommendedHomeFile
		}
	}
	if o.hubKubeconfig != "" {
		if o.hubKubeconfig, err = filepath.Abs(o.hubKubeconfig); err != nil {
			return err
		}
	}
	return nil
}

// readProfile reads the cluster's ClusterProfile in o.fromProfile with the
// hub identity, and takes the server and CA of its o.provider access
// provider: the gateway's, as hubsync publishes them to every consumer
// namespace (the CA follows the gateway's certificate).
func (o *kubeconfigOptions) readProfile(ctx context.Context) error {
	cfg, err := hubConfig(o.hubKubeconfig, o.hubContext)
	if err != nil {
		return fmt.Errorf("--from-profile: %w", err)
	}
	cs, err := cpclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, hubRequestTimeout)
	defer cancel()
	p, err := cs.ApisV1alpha1().ClusterProfiles(o.fromProfile).Get(ctx, o.cluster, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("--from-profile: ClusterProfile %s/%s: %w", o.fromProfile, o.cluster, err)
	}
	var names []string
	for _, ap := range p.Status.AccessProviders {
		if ap.Name == o.provider {
			if ap.Cluster.Server == "" {
				return fmt.Errorf("--from-profile: access provider %q of %s/%s has no server", o.provider, o.fromProfile, o.cluster)
			}
			o.server, o.caData = ap.Cluster.Server, ap.Cluster.CertificateAuthorityData
			return nil
		}
		names = append(names, ap.Name)
	}
	return fmt.Errorf("--from-profile: ClusterProfile %s/%s has no access provider %q (it has %v); --provider names it", o.fromProfile, o.cluster, o.provider, names)
}

// build makes the kubeconfig.
func (o *kubeconfigOptions) build() ([]byte, error) {
	cluster := &clientcmdapi.Cluster{Server: strings.TrimRight(o.gatewayURL, "/") + "/" + o.cluster}
	if o.server != "" {
		cluster.Server, cluster.CertificateAuthorityData = o.server, o.caData
	}
	if o.caFile != "" {
		ca, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		cluster.CertificateAuthorityData = ca
	}
	user := &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion:      clientauthenticationv1.SchemeGroupVersion.String(),
		Command:         o.command,
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		InstallHint:     "hubsync is the binary that wrote this kubeconfig; see its README.",
	}}
	userName := "hub-identity"
	if o.sa != "" {
		userName = "msa-" + o.sa
		user.Exec.Args = []string{"creds", "--managed-serviceaccount=" + o.sa, "--cluster=" + o.cluster}
		if o.saNamespace != "" {
			user.Exec.Args = append(user.Exec.Args, "--namespace="+o.saNamespace)
		}
	} else {
		user.Exec.Args = []string{"hub-token", "--kubeconfig=" + o.hubKubeconfig}
		if o.hubContext != "" {
			user.Exec.Args = append(user.Exec.Args, "--context="+o.hubContext)
		}
	}
	name := "hubsync-" + o.cluster
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = cluster
	kc.AuthInfos[name+"-"+userName] = user
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-" + userName}
	kc.CurrentContext = name
	return clientcmd.Write(*kc)
}

// hubConfig is the client configuration of a hub kubeconfig: the file
// given, else $KUBECONFIG or ~/.kube/config; the context given, else the
// current one.
func hubConfig(kubeconfig, kcontext string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kcontext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("hub kubeconfig: %w", err)
	}
	return cfg, nil
}

// hubsync hub-token is the exec plugin of kubeconfigs written by hubsync
// kubeconfig for a hub identity: it prints an ExecCredential holding the
// bearer token the hub kubeconfig authenticates with (a token, a token
// file, or what its own exec or auth provider plugin yields), with the
// token's expiry when it is a JWT.
func hubTokenCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hub-token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "the hub kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
	kcontext := fs.String("context", "", "its context (default: the current one)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := hubConfig(*kubeconfig, *kcontext)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, hubRequestTimeout)
	defer cancel()
	token, err := bearerToken(ctx, cfg)
	if err != nil {
		return err
	}
	status := &clientauthenticationv1.ExecCredentialStatus{Token: token}
	jwtExp, _ := hub.JWTExpiry([]byte(token))
	if exp := credentialExpiration(jwtExp, time.Now(), defaultMaxCacheDuration); !exp.IsZero() {
		t := metav1.NewTime(exp)
		status.ExpirationTimestamp = &t
	}
	out, err := json.Marshal(&clientauthenticationv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{APIVersion: clientauthenticationv1.SchemeGroupVersion.String(), Kind: "ExecCredential"},
		Status:   status,
	})
	if err != nil {
		return errors.New("encode ExecCredential failed")
	}
	_, err = stdout.Write(append(out, '\n'))
	return err
}

// bearerToken is the token cfg authenticates with. A static token or
// token file is read; an exec or auth-provider plugin is run by
// client-go's own transport wrappers, and the Authorization header they
// set is captured from a request that never leaves the process.
func bearerToken(ctx context.Context, cfg *rest.Config) (string, error) {
	switch {
	case strings.TrimSpace(cfg.BearerToken) != "":
		return strings.TrimSpace(cfg.BearerToken), nil
	case cfg.BearerTokenFile != "":
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return "", fmt.Errorf("hub token file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	case cfg.ExecProvider == nil && cfg.AuthProvider == nil:
		return "", errors.New("the hub kubeconfig has no bearer token (a client certificate cannot be passed on): " +
			"use a token, an exec or OIDC plugin, or --sa")
	}
	var got string
	capture := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Get("Authorization")
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})
	rt, err := rest.HTTPWrappersForConfig(cfg, capture)
	if err != nil {
		return "", fmt.Errorf("hub credential plugin: %w", err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://hub.invalid/", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("hub credential plugin: %w", err)
	}
	_ = resp.Body.Close()
	token, ok := strings.CutPrefix(got, "Bearer ")
	if !ok || token == "" {
		return "", errors.New("the hub credential plugin gave no bearer token (a client certificate cannot be passed on): use --sa")
	}
	return token, nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
