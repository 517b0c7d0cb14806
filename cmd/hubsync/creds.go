package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hubsync/hubsync/hub"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/rest"
	authexec "k8s.io/client-go/tools/auth/exec"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// hubsync creds is a client-go exec credential plugin, a drop-in
// replacement for OCM managed-serviceaccount's cp-creds: given the cluster
// name client-go passes in KUBERNETES_EXEC_INFO, it prints the token of the
// Secret "<cluster>-<msa>" in its own namespace. Unlike cp-creds it also
// prints an expirationTimestamp, so client-go runs it again before the token
// expires rather than after a 401.

const (
	execInfoEnv = "KUBERNETES_EXEC_INFO"

	defaultServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
	defaultMaxCacheDuration            = 10 * time.Minute
	// maxExpiryMargin is how long before the token's expiry client-go is
	// told to stop using it, at most; tokens with less than ten times this
	// left get a tenth of what they have left.
	maxExpiryMargin = 30 * time.Second
	// minCredentialLifetime is the least an emitted credential is cached
	// for, so that an expiry in the past never reaches client-go.
	minCredentialLifetime = time.Second
	// hubRequestTimeout bounds the Secret read: client-go waits on the
	// plugin without a deadline of its own.
	hubRequestTimeout = 30 * time.Second
)

type credsOptions struct {
	managedServiceAccount string
	// cluster and secretNamespace, when set, name the cluster and the
	// Secret's namespace outright: clients that give exec plugins no
	// cluster info (Argo CD v3.2) need them.
	cluster         string
	secretNamespace string
	// maxCache caps how long client-go may cache a credential; 0 disables
	// the cap.
	maxCache time.Duration
	// serviceAccountNamespaceFile is the pod's namespace file, the second
	// place the Secret's namespace is looked for.
	serviceAccountNamespaceFile string
	// newHubClient builds the client for the hub the Secret is on.
	newHubClient func() (kubernetes.Interface, error)
	now          func() time.Time
	// stderr receives warnings; nothing written there contains the token.
	stderr io.Writer
}

func defaultCredsOptions(stderr io.Writer) *credsOptions {
	return &credsOptions{
		maxCache:                    defaultMaxCacheDuration,
		serviceAccountNamespaceFile: defaultServiceAccountNamespaceFile,
		newHubClient:                hubClient,
		now:                         time.Now,
		stderr:                      stderr,
	}
}

func credsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return defaultCredsOptions(stderr).command(ctx, args, stdout, stderr)
}

// command parses the flags into o and prints the credential.
func (o *credsOptions) command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("creds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.managedServiceAccount, "managed-serviceaccount", o.managedServiceAccount,
		"name of the ManagedServiceAccount whose token to print (required)")
	fs.StringVar(&o.cluster, "cluster", o.cluster,
		"the managed cluster; without it the cluster comes from KUBERNETES_EXEC_INFO (provideClusterInfo: true)")
	fs.StringVar(&o.secretNamespace, "namespace", o.secretNamespace,
		"namespace of the credential Secret (default: $NAMESPACE, the pod's namespace, the kubeconfig context's, default)")
	fs.DurationVar(&o.maxCache, "max-cache-duration", o.maxCache,
		"longest client-go may cache a token before running the plugin again; 0 means until shortly before the token expires")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync creds --managed-serviceaccount=NAME [--cluster=CLUSTER] [--namespace=NS] [--max-cache-duration=DURATION]")
		fmt.Fprintln(stderr, "\nA client-go exec credential plugin (cp-creds compatible): prints an ExecCredential with")
		fmt.Fprintln(stderr, "the token of Secret <cluster>-<NAME>, cluster from --cluster or KUBERNETES_EXEC_INFO.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() != 0:
		fmt.Fprintf(stderr, "hubsync creds: unexpected arguments %v\n", fs.Args())
	case strings.TrimSpace(o.managedServiceAccount) == "":
		fmt.Fprintln(stderr, "hubsync creds: --managed-serviceaccount is required")
	case o.cluster != "" && len(validation.IsDNS1123Subdomain(o.cluster)) > 0:
		fmt.Fprintf(stderr, "hubsync creds: --cluster %q is not a valid cluster name\n", o.cluster)
	case o.secretNamespace != "" && len(validation.IsDNS1123Label(o.secretNamespace)) > 0:
		fmt.Fprintf(stderr, "hubsync creds: --namespace %q is not a valid namespace\n", o.secretNamespace)
	case o.maxCache < 0:
		fmt.Fprintf(stderr, "hubsync creds: --max-cache-duration must not be negative, got %v\n", o.maxCache)
	default:
		return o.run(ctx, os.Getenv(execInfoEnv), stdout)
	}
	fs.Usage()
	return errUsage
}

// run prints the credential for execInfo, the content of KUBERNETES_EXEC_INFO.
func (o *credsOptions) run(ctx context.Context, execInfo string, stdout io.Writer) error {
	// Check the input before touching the hub: it is the likelier mistake.
	if _, err := o.clusterName(execInfo); err != nil {
		return err
	}
	namespace := o.namespace()
	kube, err := o.newHubClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, hubRequestTimeout)
	defer cancel()
	out, err := o.credential(ctx, execInfo, kube, namespace, o.now())
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(out, '\n'))
	return err
}

// credential returns the ExecCredential JSON for execInfo, read from the
// Secret "<cluster>-<msa>" in namespace, with its expiry computed at now.
func (o *credsOptions) credential(ctx context.Context, execInfo string, kube kubernetes.Interface, namespace string, now time.Time) ([]byte, error) {
	cluster, err := o.clusterName(execInfo)
	if err != nil {
		return nil, err
	}
	name := hub.CopyName(cluster, o.managedServiceAccount)
	secret, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("secret %s/%s not found (the token of ManagedServiceAccount %q for cluster %q)",
			namespace, name, o.managedServiceAccount, cluster)
	case err != nil:
		return nil, fmt.Errorf("get secret %s/%s: %w", namespace, name, err)
	}
	token, ok := secret.Data[hub.TokenKey]
	switch {
	case !ok:
		return nil, fmt.Errorf("secret %s/%s has no %q key", namespace, name, hub.TokenKey)
	case len(token) == 0:
		return nil, fmt.Errorf("secret %s/%s has an empty %q key", namespace, name, hub.TokenKey)
	}

	expiry, err := hub.CopyExpiry(secret.Annotations, token)
	if err != nil && o.stderr != nil {
		fmt.Fprintf(o.stderr, "hubsync creds: warning: secret %s/%s: %v\n", namespace, name, err)
	}
	status := &clientauthenticationv1.ExecCredentialStatus{Token: string(token)}
	if exp := credentialExpiration(expiry, now, o.maxCache); !exp.IsZero() {
		t := metav1.NewTime(exp)
		status.ExpirationTimestamp = &t
	}
	out, err := json.Marshal(&clientauthenticationv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{
			APIVersion: clientauthenticationv1.SchemeGroupVersion.String(),
			Kind:       "ExecCredential",
		},
		Status: status,
	})
	if err != nil {
		// A struct of strings and a time does not fail to marshal; say
		// nothing more in case the error quoted the token.
		return nil, errors.New("encode ExecCredential failed")
	}
	return out, nil
}

// clusterName is the cluster --cluster names, else the one client-go
// passed in execInfo. When both are there they must agree: a mismatch is a
// configuration mistake that would hand out another cluster's token.
func (o *credsOptions) clusterName(execInfo string) (string, error) {
	if o.cluster == "" {
		return clusterName(execInfo)
	}
	if execInfo != "" {
		if fromInfo, err := clusterName(execInfo); err == nil && fromInfo != o.cluster {
			return "", fmt.Errorf("--cluster %q but %s names cluster %q", o.cluster, execInfoEnv, fromInfo)
		}
	}
	return o.cluster, nil
}

// clusterName returns the cluster name of the ExecCredential in execInfo:
// spec.cluster.config.clusterName, which client-go fills in from the
// client.authentication.k8s.io/exec extension when provideClusterInfo is true.
func clusterName(execInfo string) (string, error) {
	if execInfo == "" {
		return "", fmt.Errorf("%s is not set: hubsync creds is a client-go exec credential plugin, run by client-go from an exec config with provideClusterInfo: true", execInfoEnv)
	}
	// Look at the type first: client-go's loader would accept other
	// versions, or fail with a message about schemes.
	var peek clientauthenticationv1.ExecCredential
	if err := yaml.Unmarshal([]byte(execInfo), &peek); err != nil {
		return "", fmt.Errorf("%s is not an ExecCredential: %w", execInfoEnv, err)
	}
	want := clientauthenticationv1.SchemeGroupVersion.String()
	if peek.APIVersion != want {
		return "", fmt.Errorf("%s has apiVersion %q, want %q (set apiVersion: %s in the exec config)", execInfoEnv, peek.APIVersion, want, want)
	}
	if peek.Kind != "ExecCredential" {
		return "", fmt.Errorf("%s has kind %q, want \"ExecCredential\"", execInfoEnv, peek.Kind)
	}
	if peek.Spec.Cluster == nil {
		return "", fmt.Errorf("%s has no spec.cluster: set provideClusterInfo: true in the exec config", execInfoEnv)
	}
	obj, _, err := authexec.LoadExecCredential([]byte(execInfo))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", execInfoEnv, err)
	}
	ec, ok := obj.(*clientauthenticationv1.ExecCredential)
	if !ok {
		return "", fmt.Errorf("read %s: got %T, want a %s ExecCredential", execInfoEnv, obj, want)
	}
	// cp-creds (through cluster-inventory-api's credentialplugin) insists
	// on the server too.
	if server := strings.TrimSpace(ec.Spec.Cluster.Server); server == "" || server == "null" {
		return "", fmt.Errorf("%s has no spec.cluster.server", execInfoEnv)
	}
	if len(ec.Spec.Cluster.Config.Raw) == 0 {
		return "", fmt.Errorf("%s has no spec.cluster.config: the cluster needs a %s extension with clusterName", execInfoEnv, hub.ExecExtensionKey)
	}
	var cfg hub.ExecClusterConfig
	if err := json.Unmarshal(ec.Spec.Cluster.Config.Raw, &cfg); err != nil {
		return "", fmt.Errorf("%s has an invalid spec.cluster.config: %w", execInfoEnv, err)
	}
	if cfg.ClusterName == "" {
		return "", fmt.Errorf("%s has no clusterName in spec.cluster.config: the cluster's %s extension needs one", execInfoEnv, hub.ExecExtensionKey)
	}
	return cfg.ClusterName, nil
}

// namespace is where the credential Secrets are: --namespace, else $NAMESPACE, else the pod's
// namespace, else the kubeconfig context's, else "default".
func (o *credsOptions) namespace() string {
	if o.secretNamespace != "" {
		return o.secretNamespace
	}
	if ns := strings.TrimSpace(os.Getenv("NAMESPACE")); ns != "" {
		return ns
	}
	if o.serviceAccountNamespaceFile != "" {
		if data, err := os.ReadFile(o.serviceAccountNamespaceFile); err == nil {
			if ns := strings.TrimSpace(string(data)); ns != "" {
				return ns
			}
		}
	}
	// The default loading rules read $KUBECONFIG (a list of files, merged)
	// or ~/.kube/config.
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{})
	if ns, _, err := cc.Namespace(); err == nil && strings.TrimSpace(ns) != "" {
		return strings.TrimSpace(ns)
	}
	return "default"
}

// hubClient connects to the hub: in-cluster, else through $KUBECONFIG, else
// ~/.kube/config.
func hubClient() (kubernetes.Interface, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			where := "~/.kube/config"
			if k := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); k != "" {
				where = "KUBECONFIG " + k
			}
			if clientcmd.IsEmptyConfig(err) {
				return nil, fmt.Errorf("hub client: not running in a cluster, and no kubeconfig in %s", where)
			}
			return nil, fmt.Errorf("hub client: not running in a cluster, and %s: %w", where, err)
		}
	}
	cfg.UserAgent = "hubsync-creds/" + buildVersion()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("hub client: %w", err)
	}
	return kube, nil
}

// credentialExpiration is the expirationTimestamp to give client-go for a
// token expiring at expiry (zero: unknown), at now, with at most maxCache of
// caching (0: no cap). Zero means none.
//
//	margin = min(30s, (expiry-now)/10)
//	t      = min(expiry - margin, now + maxCache)
//	t      = now + 1s  if t <= now
//
// With no known expiry, t = now + maxCache, or none when maxCache is 0. As
// the timestamp is sent in whole seconds, t is rounded down to one, which
// only makes it earlier; the now + 1s floor is rounded up, so the credential
// is never already expired when client-go reads it.
func credentialExpiration(expiry, now time.Time, maxCache time.Duration) time.Time {
	var t time.Time
	switch {
	case !expiry.IsZero():
		margin := min(maxExpiryMargin, max(expiry.Sub(now)/10, 0))
		t = expiry.Add(-margin)
		if maxCache > 0 && now.Add(maxCache).Before(t) {
			t = now.Add(maxCache)
		}
	case maxCache > 0:
		t = now.Add(maxCache)
	default:
		return time.Time{}
	}
	if t = t.Truncate(time.Second); !t.After(now) {
		t = ceilSecond(now.Add(minCredentialLifetime))
	}
	return t
}

// ceilSecond rounds t up to a whole second.
func ceilSecond(t time.Time) time.Time {
	r := t.Truncate(time.Second)
	if r.Before(t) {
		r = r.Add(time.Second)
	}
	return r
}
