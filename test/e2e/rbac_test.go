package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta2 "open-cluster-management.io/api/cluster/v1beta2"
	msaclient "open-cluster-management.io/managed-serviceaccount/pkg/generated/clientset/versioned"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/syncer"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// The identity deploy/ gives hubsync.
const (
	hubNamespace       = "open-cluster-management-hub"
	hubServiceAccount  = "hubsync"
	hubServiceAcctUser = "system:serviceaccount:" + hubNamespace + ":" + hubServiceAccount
)

// The ClusterRole of rbac.yaml that only credential copies need, and the
// Role that replaces it for the access providers' CA Secret watches when
// credentials are off.
const (
	credentialsRole = "hubsync-credentials"
	caRoleFile      = "without-credentials/ca-secret-role.yaml"
	// kueueRole is the kueue sink's ClusterRole, which the syncer alone
	// does not use (TestKueueSink runs the daemon with it).
	kueueRole = "hubsync-kueue"
)

// credentialSecretVerbs are the verbs on Secrets that credential copies use.
var credentialSecretVerbs = []string{"create", "delete", "get", "list", "update", "watch"}

// hubServiceAcctGroups are the groups the API server gives the
// ServiceAccount, so that access reviews also count any group grants.
var hubServiceAcctGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + hubNamespace, "system:authenticated"}

// deployObjects are the typed objects of one deploy/ manifest, decoded
// strictly (unknown or duplicated fields are errors).
type deployObjects struct {
	serviceAccounts     []*corev1.ServiceAccount
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
	configMaps          []*corev1.ConfigMap
	leases              []*coordinationv1.Lease
	other               []runtime.Object
}

func deployFile(name string) string { return filepath.Join("..", "..", "deploy", name) }

func loadDeploy(t *testing.T, names ...string) *deployObjects {
	t.Helper()
	out := &deployObjects{}
	dec := serializer.NewCodecFactory(clientgoscheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	for _, name := range names {
		docs, err := yamlDocuments(deployFile(name))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docs {
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s document %d: %v", name, i+1, err)
			}
			switch o := obj.(type) {
			case *corev1.ServiceAccount:
				out.serviceAccounts = append(out.serviceAccounts, o)
			case *rbacv1.ClusterRole:
				out.clusterRoles = append(out.clusterRoles, o)
			case *rbacv1.ClusterRoleBinding:
				out.clusterRoleBindings = append(out.clusterRoleBindings, o)
			case *rbacv1.Role:
				out.roles = append(out.roles, o)
			case *rbacv1.RoleBinding:
				out.roleBindings = append(out.roleBindings, o)
			case *corev1.ConfigMap:
				out.configMaps = append(out.configMaps, o)
			case *coordinationv1.Lease:
				out.leases = append(out.leases, o)
			default:
				out.other = append(out.other, o)
			}
		}
	}
	return out
}

// yamlDocuments splits a multi-document YAML file, dropping documents that
// hold only comments.
func yamlDocuments(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", path, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue
		}
		docs = append(docs, doc)
	}
}

// hubsyncConfig returns the configuration that deploy/config.yaml gives the
// daemon, parsed and validated as the daemon does.
func hubsyncConfig(t *testing.T) *config.Config {
	t.Helper()
	d := loadDeploy(t, "config.yaml")
	if len(d.configMaps) != 1 {
		t.Fatalf("config.yaml: want one ConfigMap, got %d", len(d.configMaps))
	}
	data, ok := d.configMaps[0].Data["config.yaml"]
	if !ok {
		t.Fatalf("config.yaml: the ConfigMap has no config.yaml key")
	}
	// Decoded and checked, but for the files it names: they are the pod's
	// (the bus's certificate, mounted from its Secret).
	cfg, err := config.Decode([]byte(data))
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return cfg
}

// grant is one rule of deploy/rbac.yaml as it applies to the ServiceAccount:
// in every namespace (a bound ClusterRole) or in one (a bound Role).
type grant struct {
	source    string
	namespace string // "" for every namespace and cluster-scoped resources
	rule      rbacv1.PolicyRule
}

// grants returns the rules bound to the ServiceAccount, failing the test on
// a binding to a role the file does not define.
func (d *deployObjects) grants(t *testing.T) []grant {
	t.Helper()
	isHubsync := func(subjects []rbacv1.Subject) bool {
		for _, s := range subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == hubServiceAccount && s.Namespace == hubNamespace {
				return true
			}
		}
		return false
	}
	var out []grant
	for _, b := range d.clusterRoleBindings {
		if !isHubsync(b.Subjects) {
			continue
		}
		i := slices.IndexFunc(d.clusterRoles, func(r *rbacv1.ClusterRole) bool { return r.Name == b.RoleRef.Name })
		if b.RoleRef.Kind != "ClusterRole" || i < 0 {
			t.Fatalf("ClusterRoleBinding %s refers to %s %s, which rbac.yaml does not define", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		for _, r := range d.clusterRoles[i].Rules {
			out = append(out, grant{source: "ClusterRole " + b.RoleRef.Name, rule: r})
		}
	}
	for _, b := range d.roleBindings {
		if !isHubsync(b.Subjects) {
			continue
		}
		if b.RoleRef.Kind != "Role" {
			t.Fatalf("RoleBinding %s/%s refers to %s %s; want a Role of rbac.yaml", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		i := slices.IndexFunc(d.roles, func(r *rbacv1.Role) bool { return r.Name == b.RoleRef.Name && r.Namespace == b.Namespace })
		if i < 0 {
			t.Fatalf("RoleBinding %s/%s refers to Role %s, which rbac.yaml does not define in %s", b.Namespace, b.Name, b.RoleRef.Name, b.Namespace)
		}
		for _, r := range d.roles[i].Rules {
			out = append(out, grant{source: "Role " + b.Namespace + "/" + b.RoleRef.Name, namespace: b.Namespace, rule: r})
		}
	}
	return out
}

// without returns the objects without a ClusterRole and its bindings.
func (d *deployObjects) without(clusterRole string) *deployObjects {
	out := *d
	out.clusterRoles = slices.DeleteFunc(slices.Clone(d.clusterRoles), func(r *rbacv1.ClusterRole) bool { return r.Name == clusterRole })
	out.clusterRoleBindings = slices.DeleteFunc(slices.Clone(d.clusterRoleBindings), func(b *rbacv1.ClusterRoleBinding) bool {
		return b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == clusterRole
	})
	return &out
}

// allowedBy reports whether one of the grants allows r.
func allowedBy(grants []grant, r apiRequest) bool {
	return slices.ContainsFunc(grants, func(g grant) bool { return g.allows(r) })
}

// caProvider returns the configuration's access provider with a caSecret.
func caProvider(t *testing.T, cfg *config.Config) config.AccessProvider {
	t.Helper()
	for _, p := range cfg.AccessProviders {
		if p.CASecret != nil {
			return p
		}
	}
	t.Fatalf("config.yaml: no access provider with a caSecret")
	return config.AccessProvider{}
}

// TestRBACManifest checks deploy/rbac.yaml on its own and against the rest
// of deploy/: no wildcards; Secrets and ManagedServiceAccounts only in the
// credentials ClusterRole, with exactly the verbs the copies use; every rule
// bound to hubsync's ServiceAccount; the leader-election Lease it grants is
// the one the configuration names; the CA Secret of every access provider
// can be watched, with credentials on (rbac.yaml alone) and off (rbac.yaml
// without the credentials ClusterRole, with without-credentials/).
func TestRBACManifest(t *testing.T) {
	d := loadDeploy(t, "rbac.yaml", "serviceaccount.yaml")
	if len(d.other) > 0 || len(d.configMaps) > 0 {
		t.Fatalf("unexpected kinds in rbac.yaml or serviceaccount.yaml: %d", len(d.other)+len(d.configMaps))
	}
	// The leader election's Lease, made with the RBAC so that removing
	// the manifests removes it; hubsync only takes and renews it.
	if len(d.leases) != 1 || d.leases[0].Namespace != hubNamespace || d.leases[0].Spec.HolderIdentity != nil {
		t.Fatalf("rbac.yaml must hold exactly the leader election's Lease in %s, with no holder: %+v", hubNamespace, d.leases)
	}
	if len(d.serviceAccounts) != 1 || d.serviceAccounts[0].Name != hubServiceAccount || d.serviceAccounts[0].Namespace != hubNamespace {
		t.Fatalf("serviceaccount.yaml must define exactly %s/%s", hubNamespace, hubServiceAccount)
	}
	var all []rbacv1.PolicyRule
	for _, r := range d.clusterRoles {
		all = append(all, r.Rules...)
	}
	for _, r := range d.roles {
		if r.Namespace != hubNamespace {
			t.Errorf("Role %s is in namespace %q, want %s", r.Name, r.Namespace, hubNamespace)
		}
		all = append(all, r.Rules...)
	}
	for _, r := range all {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames} {
			for _, v := range list {
				if strings.Contains(v, "*") {
					t.Errorf("wildcard %q in rule %+v", v, r)
				}
			}
		}
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule grants non-resource URLs: %+v", r)
		}
	}
	// Access to Secrets (and to ManagedServiceAccounts) is the credential
	// copies', and no more than they use: no patch, no deletecollection, no
	// status, and nowhere else.
	exact := map[string][]string{"secrets": credentialSecretVerbs, "managedserviceaccounts": {"list", "watch"}}
	sensitive := func(source string, r rbacv1.PolicyRule, ok bool) {
		for _, res := range r.Resources {
			base, sub, _ := strings.Cut(res, "/")
			want, found := exact[base]
			if !found {
				continue
			}
			if !ok || sub != "" || len(r.ResourceNames) > 0 || !slices.Equal(slices.Sorted(slices.Values(r.Verbs)), want) {
				t.Errorf("%s grants %+v; only %s may grant %s, exactly %v", source, r, credentialsRole, res, want)
			}
		}
	}
	for _, cr := range d.clusterRoles {
		for _, r := range cr.Rules {
			sensitive("ClusterRole "+cr.Name, r, cr.Name == credentialsRole)
		}
	}
	for _, role := range d.roles {
		for _, r := range role.Rules {
			sensitive("Role "+role.Name, r, false)
		}
	}
	if !slices.ContainsFunc(d.clusterRoles, func(r *rbacv1.ClusterRole) bool { return r.Name == credentialsRole }) {
		t.Fatalf("rbac.yaml has no ClusterRole %s", credentialsRole)
	}
	// Every rule defined is bound to hubsync, and nothing else is bound.
	bound := 0
	for _, b := range d.clusterRoleBindings {
		bound += len(b.Subjects)
	}
	for _, b := range d.roleBindings {
		bound += len(b.Subjects)
	}
	if g := d.grants(t); len(g) != len(all) || bound != len(d.clusterRoleBindings)+len(d.roleBindings) {
		t.Fatalf("%d rules defined, %d bound to %s; %d subjects in %d bindings", len(all), len(g), hubServiceAcctUser, bound, len(d.clusterRoleBindings)+len(d.roleBindings))
	}

	cfg := hubsyncConfig(t)
	if !cfg.LeaderElection.Enabled {
		t.Fatalf("config.yaml: leader election is not enabled")
	}
	leaseGranted := func(verb, name string) bool {
		for _, g := range d.grants(t) {
			if g.namespace == cfg.LeaderElection.Namespace && g.allows(apiRequest{
				verb: verb, group: coordinationv1.GroupName, resource: "leases",
				namespace: cfg.LeaderElection.Namespace, name: name,
			}) {
				return true
			}
		}
		return false
	}
	for _, verb := range []string{"get", "update"} {
		if !leaseGranted(verb, cfg.LeaderElection.Name) {
			t.Errorf("rbac.yaml does not grant %s on Lease %s/%s that config.yaml names", verb, cfg.LeaderElection.Namespace, cfg.LeaderElection.Name)
		}
	}
	if !leaseGranted("create", "") {
		t.Errorf("rbac.yaml does not grant create on Leases in %s", cfg.LeaderElection.Namespace)
	}

	// Credential copies, as config.yaml turns them on: Secrets in any
	// namespace, ManagedServiceAccounts in every cluster namespace.
	grants := d.grants(t)
	if !cfg.CredentialsEnabled() {
		t.Errorf("config.yaml: credentials are off; TestRBAC and TestRBACDaemon expect the default, on")
	}
	for _, verb := range credentialSecretVerbs {
		if r := (apiRequest{verb: verb, resource: "secrets", namespace: "any-consumer"}); !allowedBy(grants, r) {
			t.Errorf("rbac.yaml does not allow %s", r)
		}
	}
	for _, verb := range []string{"list", "watch"} {
		for _, r := range []apiRequest{
			{verb: verb, resource: "secrets"},
			{verb: verb, group: "authentication.open-cluster-management.io", resource: "managedserviceaccounts"},
		} {
			if !allowedBy(grants, r) {
				t.Errorf("rbac.yaml does not allow %s", r)
			}
		}
	}

	// The CA Secret watch of every caSecret provider in config.yaml: a list
	// and a watch in its namespace, allowed by the credentials ClusterRole,
	// and with credentials off by without-credentials/ alone.
	ca := loadDeploy(t, caRoleFile)
	if len(ca.roles) != 1 || len(ca.roleBindings) != 1 || len(ca.clusterRoles)+len(ca.clusterRoleBindings)+len(ca.serviceAccounts)+len(ca.configMaps)+len(ca.other) > 0 {
		t.Fatalf("%s: want one Role and one RoleBinding", caRoleFile)
	}
	for _, r := range ca.roles[0].Rules {
		if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{"secrets"}) ||
			!slices.Equal(slices.Sorted(slices.Values(r.Verbs)), []string{"list", "watch"}) || len(r.ResourceNames) == 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: rule %+v; want list and watch of named secrets only", caRoleFile, r)
		}
	}
	caGrants := ca.grants(t)
	if len(caGrants) != len(ca.roles[0].Rules) {
		t.Fatalf("%s: the Role is not bound to %s", caRoleFile, hubServiceAcctUser)
	}
	off := append(d.without(credentialsRole).grants(t), caGrants...)
	for _, r := range []apiRequest{
		{verb: "list", resource: "secrets"},
		{verb: "list", resource: "secrets", namespace: "any-consumer"},
		{verb: "list", resource: "secrets", namespace: ca.roles[0].Namespace},
		{verb: "get", resource: "secrets", namespace: ca.roles[0].Namespace, name: ca.roles[0].Rules[0].ResourceNames[0]},
	} {
		if allowedBy(off, r) {
			t.Errorf("without %s, rbac.yaml and %s still allow %s", credentialsRole, caRoleFile, r)
		}
	}
	providers := 0
	for _, p := range cfg.AccessProviders {
		if p.CASecret == nil {
			continue
		}
		providers++
		for _, verb := range []string{"list", "watch"} {
			r := apiRequest{verb: verb, resource: "secrets", namespace: p.CASecret.Namespace, name: p.CASecret.Name}
			if !allowedBy(grants, r) {
				t.Errorf("access provider %s: rbac.yaml does not allow %s", p.Name, r)
			}
			if !allowedBy(off, r) {
				t.Errorf("access provider %s: without %s, %s does not allow %s", p.Name, credentialsRole, caRoleFile, r)
			}
		}
	}
	if providers == 0 {
		t.Errorf("config.yaml: no access provider with a caSecret (cluster-proxy's); TestRBAC expects one")
	}
}

// TestRBAC runs the syncer as hubsync's ServiceAccount with exactly the
// permissions of deploy/rbac.yaml, and the same leader election, access
// provider and credential copies as the daemon, over a small fleet that
// makes it use every kind of request it has: profile create, status write,
// restore and delete, a conflict Event, a repeated Event, the Lease, the CA
// Secret watch, and credential copies created, updated on rotation (with a
// CredentialRotated Event on the ManagedServiceAccount), deleted when the
// sync label goes, and a create that meets another owner's Secret (the get,
// and a CredentialNotCopied Event). It records every request the
// ServiceAccount sends and checks that none is refused and that every
// permission granted was used; access reviews check that it cannot write
// ManagedServiceAccounts, patch or mass-delete Secrets, or write the fleet.
func TestRBAC(t *testing.T) {
	d := loadDeploy(t, "serviceaccount.yaml", "rbac.yaml")
	grants := d.grants(t)
	hubCfg := hubsyncConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	installRBAC(ctx, t, admin, d)

	// Every request the ServiceAccount makes goes through reqs.
	proxy := caProvider(t, hubCfg)
	asHubsync, reqs := impersonateHubsync(t, proxy.CASecret.Namespace)
	kube, err := kubernetes.NewForConfig(asHubsync)
	if err != nil {
		t.Fatal(err)
	}

	// What the daemon does besides the syncer: discovery of the APIs it
	// needs, probes of the hub's /readyz (both allowed to every
	// authenticated user by the API server's bootstrap roles), and leader
	// election with the configured Lease.
	if err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		t.Fatalf("probe /readyz as %s: %v", hubServiceAcctUser, err)
	}
	for _, gv := range []string{"multicluster.x-k8s.io/v1alpha1", "cluster.open-cluster-management.io/v1", "cluster.open-cluster-management.io/v1beta2"} {
		if _, err := kube.Discovery().ServerResourcesForGroupVersion(gv); err != nil {
			t.Fatalf("discover %s as %s: %v", gv, hubServiceAcctUser, err)
		}
	}
	runLeaderElection(ctx, t, admin, kube, hubCfg.LeaderElection)

	// config.yaml's access provider (cluster-proxy's, CA from a Secret) and
	// credential copies, whose ManagedServiceAccount client also acts as
	// the ServiceAccount through reqs.
	msas, err := msaclient.NewForConfig(asHubsync)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, withSyncerConfig(asHubsync), withOptions(func(o *syncer.Options) {
		o.AccessProviders = hubCfg.AccessProviders
		o.Credentials = &syncer.CredentialOptions{Client: msas, Workers: 2, Coalesce: 50 * time.Millisecond}
	}))
	expectAbsentNamespaceListable(h, *proxy.CASecret)
	ns := h.namespaces("red", "blue")
	// The shipped admission policy is in force: every Secret the syncer
	// writes below passes it.
	probeCfg := rest.CopyConfig(hubConfig)
	probeCfg.Impersonate = rest.ImpersonationConfig{UserName: hubServiceAcctUser}
	probe, err := kubernetes.NewForConfig(probeCfg)
	h.must(err)
	installAdmissionPolicy(h.ctx, t, admin, probe, ns[0])
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	c1, c2 := h.name("c1"), h.name("c2")
	// A profile of another manager blocks c2's in the red namespace.
	_, err = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[0]).Create(h.ctx, &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: c2, Namespace: ns[0], Labels: map[string]string{hub.LabelClusterManager: "someone-else"}},
		Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "theirs", ClusterManager: cpv1alpha1.ClusterManager{Name: "someone-else"}},
	}, metav1.CreateOptions{})
	h.must(err)
	h.cluster(c1, set, nil)
	h.cluster(c2, set, nil)
	h.must(h.hub.Bind(h.ctx, ns[0], set, true))
	h.must(h.hub.Bind(h.ctx, ns[1], set, true))

	// Creates and status writes.
	h.expectProfiles(ns[1], c1, c2)
	h.eventually("c1 in red beside the foreign c2", func() error {
		names, err := h.hub.ProfileNames(h.ctx, ns[0])
		if err != nil {
			return err
		}
		if strings.Join(names, ",") != c1+","+c2 {
			return fmt.Errorf("profiles %v", names)
		}
		return h.checkProfile(ns[0], c1)
	})
	// Events: created in the consumer namespace.
	h.expectEvent(ns[0], c2, "ProfileConflict")

	// Status writes of an existing profile.
	h.must(h.hub.UpdateClusterStatus(h.ctx, c1, func(st *clusterv1.ManagedClusterStatus) {
		st.Version.Kubernetes = "v1.36.1"
	}))
	h.expectProfiles(ns[1], c1, c2)

	// Updates: an edited spec is restored.
	h.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[1]).Get(h.ctx, c1, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Spec.DisplayName = "edited"
		_, err = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns[1]).Update(h.ctx, p, metav1.UpdateOptions{})
		return err
	}))
	h.expectProfiles(ns[1], c1, c2)

	// Events: a repeated one is patched (its count raised), here an invalid
	// selector reported again after its set changed.
	bad := h.name("bad")
	h.must(h.hub.CreateLabelSelectorSet(h.ctx, bad, &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Sometimes", Values: []string{"x"}}},
	}))
	h.expectEvent(metav1.NamespaceDefault, bad, "InvalidClusterSelector")
	h.must(h.hub.UpdateSet(h.ctx, bad, func(s *clusterv1beta2.ManagedClusterSet) {
		metav1.SetMetaDataAnnotation(&s.ObjectMeta, "example.com/touched", "yes")
	}))
	h.eventually("InvalidClusterSelector event counted twice", func() error {
		evs, err := h.hub.Kube.CoreV1().Events(metav1.NamespaceDefault).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "InvalidClusterSelector" && e.InvolvedObject.Name == bad && e.Count >= 2 {
				return nil
			}
		}
		return errors.New("not yet")
	})

	// The CA Secret appears: every profile gets the provider's entry.
	putCASecret(h, *proxy.CASecret, "RBAC-CA-1")
	for _, n := range ns {
		h.expectCAEntry(proxy, n, c1, "RBAC-CA-1")
	}

	// Credential copies: created next to both of c1's profiles, ...
	exp := time.Now().Add(time.Hour)
	_, err = h.hub.CreateMSA(h.ctx, c1, "app", true)
	h.must(err)
	tok := fleet.FakeJWT(exp)
	h.must(h.hub.PutToken(h.ctx, c1, "app", tok, nil))
	for _, n := range ns {
		h.expectSecretToken(n, c1+"-app", tok)
	}
	// ... updated on rotation, with an Event on the MSA in c1's namespace,
	tok = fleet.FakeJWT(exp.Add(time.Hour))
	h.must(h.hub.PutToken(h.ctx, c1, "app", tok, nil))
	for _, n := range ns {
		h.expectSecretToken(n, c1+"-app", tok)
	}
	h.expectEvent(c1, "app", "CredentialRotated")
	// ... left alone where another owner's Secret has the name: the create
	// fails with AlreadyExists and a get tells that it is not a copy,
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: c1 + "-other", Namespace: ns[1]}, StringData: map[string]string{"token": "theirs"}}
	_, err = h.hub.Kube.CoreV1().Secrets(ns[1]).Create(h.ctx, foreign, metav1.CreateOptions{})
	h.must(err)
	_, err = h.hub.CreateMSA(h.ctx, c1, "other", true)
	h.must(err)
	other := fleet.FakeJWT(exp)
	h.must(h.hub.PutToken(h.ctx, c1, "other", other, nil))
	h.expectSecretToken(ns[0], c1+"-other", other)
	h.expectEvent(c1, "other", "CredentialNotCopied")
	h.expectSecretToken(ns[1], c1+"-other", "theirs")
	// ... and deleted when the MSA loses its sync label.
	h.must(h.hub.SetMSASync(h.ctx, c1, "app", false))
	for _, n := range ns {
		h.expectSecretToken(n, c1+"-app", "")
	}

	// Deletes: a cluster's profiles go with it (and its remaining copy);
	// the foreign profile stays.
	h.must(h.hub.DeleteCluster(h.ctx, c1))
	h.expectProfiles(ns[1], c2)
	h.expectSecretToken(ns[0], c1+"-other", "")
	h.eventually("only the foreign profile left in red", func() error {
		ps, err := h.hub.ProfilesIn(h.ctx, ns[0])
		if err != nil {
			return err
		}
		if len(ps) != 1 || ps[c2] == nil || hub.IsOwned(ps[c2], manager) {
			return fmt.Errorf("profiles %v", ps)
		}
		return nil
	})
	h.waitIdle()

	reqs.check(t, grants, d.without(kueueRole).grants(t))
	checkAccess(ctx, t, admin, grants, []authorizationv1.ResourceAttributes{
		// Copies are written whole (update), and deleted one by one with a
		// UID precondition.
		{Verb: "patch", Resource: "secrets", Namespace: "consumer", Name: "c1-app"},
		{Verb: "deletecollection", Resource: "secrets", Namespace: "consumer"},
		{Verb: "deletecollection", Resource: "secrets"},
	})
}

// TestRBACWithoutCredentials runs the syncer as hubsync's ServiceAccount
// with credentials off, as deploy/ documents it: rbac.yaml without the
// credentials ClusterRole, plus without-credentials/ca-secret-role.yaml
// for config.yaml's CA Secret. The CA watch works with that Role alone,
// which names the Secret (the API server authorizes a list or watch with a
// metadata.name field selector as a request for that name); every request
// is allowed, the Role's verbs are used, and the ServiceAccount has no
// other access to Secrets.
func TestRBACWithoutCredentials(t *testing.T) {
	d := loadDeploy(t, "serviceaccount.yaml", "rbac.yaml", caRoleFile).without(credentialsRole)
	grants := d.grants(t)
	proxy := caProvider(t, hubsyncConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	installRBAC(ctx, t, admin, d)
	asHubsync, reqs := impersonateHubsync(t, proxy.CASecret.Namespace)

	h := newHarness(t, withSyncerConfig(asHubsync), withOptions(func(o *syncer.Options) {
		o.AccessProviders = []config.AccessProvider{proxy}
	}))
	ns := h.namespaces("consumer")[0]
	set, c := h.name("set"), h.name("c")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	h.cluster(c, set, nil)
	h.must(h.hub.Bind(h.ctx, ns, set, true))
	h.expectProfiles(ns, c)
	putCASecret(h, *proxy.CASecret, "RBAC-CA-2")
	h.expectCAEntry(proxy, ns, c, "RBAC-CA-2")
	h.waitIdle()

	var caGrants []grant
	for _, g := range grants {
		if slices.Contains(g.rule.Resources, "secrets") {
			caGrants = append(caGrants, g)
		}
	}
	if len(caGrants) == 0 {
		t.Fatalf("no grant on secrets from %s", caRoleFile)
	}
	reqs.check(t, grants, caGrants)
	caNS := proxy.CASecret.Namespace
	checkAccess(ctx, t, admin, grants, []authorizationv1.ResourceAttributes{
		{Verb: "get", Resource: "secrets"},
		{Verb: "list", Resource: "secrets"},
		{Verb: "watch", Resource: "secrets"},
		{Verb: "get", Resource: "secrets", Namespace: hubNamespace},
		{Verb: "list", Resource: "secrets", Namespace: hubNamespace},
		{Verb: "list", Resource: "secrets", Namespace: "consumer"},
		{Verb: "create", Resource: "secrets", Namespace: "consumer"},
		{Verb: "list", Resource: "secrets", Namespace: caNS},
		{Verb: "watch", Resource: "secrets", Namespace: caNS, Name: "cluster-proxy-signer"},
		{Verb: "get", Resource: "secrets", Namespace: caNS, Name: proxy.CASecret.Name},
		{Verb: "create", Resource: "secrets", Namespace: caNS},
		{Verb: "update", Resource: "secrets", Namespace: caNS, Name: proxy.CASecret.Name},
		{Verb: "delete", Resource: "secrets", Namespace: caNS, Name: proxy.CASecret.Name},
		{Verb: "list", Group: "authentication.open-cluster-management.io", Resource: "managedserviceaccounts"},
	})
}

// expectAbsentNamespaceListable checks what a CA Secret watch does on a hub
// without cluster-proxy, whose namespace does not exist: the list
// succeeds, empty, so hubsync's caches sync and profiles just carry no
// entry.
func expectAbsentNamespaceListable(h *harness, ref config.SecretKeyRef) {
	h.t.Helper()
	cfg := rest.CopyConfig(hubConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: hubServiceAcctUser}
	kube, err := kubernetes.NewForConfig(cfg)
	h.must(err)
	absent := h.name("no-cluster-proxy")
	list, err := kube.CoreV1().Secrets(absent).List(h.ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", ref.Name).String()})
	if err != nil || len(list.Items) != 0 {
		h.t.Fatalf("list of the CA Secret in the absent namespace %s: %v, %v", absent, list, err)
	}
}

// putCASecret creates or updates an access provider's CA Secret (and its
// namespace), with key ca, and deletes it when the test ends.
func putCASecret(h *harness, ref config.SecretKeyRef, ca string) {
	h.t.Helper()
	h.must(h.hub.Namespace(h.ctx, ref.Namespace))
	secrets := h.hub.Kube.CoreV1().Secrets(ref.Namespace)
	h.t.Cleanup(func() {
		if err := secrets.Delete(context.Background(), ref.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			h.t.Errorf("delete CA Secret: %v", err)
		}
	})
	data := map[string][]byte{ref.Key: []byte(ca), "tls.key": []byte("not-for-hubsync")}
	_, err := secrets.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: ref.Namespace}, Data: data}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := secrets.Get(h.ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Data = data
			_, err = secrets.Update(h.ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	h.must(err)
}

// expectCAEntry waits until the profile carries the provider's entry for
// its cluster with the given CA.
func (h *harness) expectCAEntry(p config.AccessProvider, ns, cluster, ca string) {
	h.t.Helper()
	server, err := config.RenderServer(p.Server, cluster)
	h.must(err)
	h.eventually(fmt.Sprintf("%s entry with CA %s in %s/%s", p.Name, ca, ns, cluster), func() error {
		prof, err := h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Get(h.ctx, cluster, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if e := entry(prof, p.Name); e == nil || e.Cluster.Server != server || string(e.Cluster.CertificateAuthorityData) != ca {
			return fmt.Errorf("entry %+v", e)
		}
		return nil
	})
}

// expectSecretToken waits until the Secret ns/name holds token, or is gone
// when token is "".
func (h *harness) expectSecretToken(ns, name, token string) {
	h.t.Helper()
	what := fmt.Sprintf("Secret %s/%s gone", ns, name)
	if token != "" {
		what = fmt.Sprintf("Secret %s/%s with the current token", ns, name)
	}
	h.eventually(what, func() error {
		sec, err := h.hub.Kube.CoreV1().Secrets(ns).Get(h.ctx, name, metav1.GetOptions{})
		switch {
		case token == "" && apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case token == "":
			return errors.New("still there")
		case string(sec.Data["token"]) != token:
			return errors.New("another token")
		}
		return nil
	})
}

// installRBAC creates the namespaces if needed and the objects of
// serviceaccount.yaml and rbac.yaml (or whichever d holds), deletes them
// when the test ends, and waits until the authorizer sees the bindings.
func installRBAC(ctx context.Context, t *testing.T, admin kubernetes.Interface, d *deployObjects) {
	t.Helper()
	namespaces := []string{hubNamespace}
	for _, r := range d.roles {
		namespaces = append(namespaces, r.Namespace)
	}
	for _, n := range namespaces {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", n, err)
		}
	}
	var deletes []func(context.Context) error
	t.Cleanup(func() {
		ctx := context.Background()
		for i := len(deletes) - 1; i >= 0; i-- {
			if err := deletes[i](ctx); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("clean up RBAC: %v", err)
			}
		}
	})
	create := func(kind, name string, err error, del func(context.Context) error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s %s: %v", kind, name, err)
		}
		deletes = append(deletes, del)
	}
	del := metav1.DeleteOptions{}
	for _, o := range d.serviceAccounts {
		_, err := admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		create("ServiceAccount", o.Name, err, func(ctx context.Context) error {
			return admin.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, del)
		})
	}
	for _, o := range d.clusterRoles {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		create("ClusterRole", o.Name, err, func(ctx context.Context) error {
			return admin.RbacV1().ClusterRoles().Delete(ctx, o.Name, del)
		})
	}
	for _, o := range d.clusterRoleBindings {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		create("ClusterRoleBinding", o.Name, err, func(ctx context.Context) error {
			return admin.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, del)
		})
	}
	for _, o := range d.roles {
		_, err := admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		create("Role", o.Name, err, func(ctx context.Context) error {
			return admin.RbacV1().Roles(o.Namespace).Delete(ctx, o.Name, del)
		})
	}
	for _, o := range d.roleBindings {
		_, err := admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		create("RoleBinding", o.Name, err, func(ctx context.Context) error {
			return admin.RbacV1().RoleBindings(o.Namespace).Delete(ctx, o.Name, del)
		})
	}
	// The authorizer reads RBAC objects from its own informers.
	start := time.Now()
	for _, g := range d.grants(t) {
		a := g.attributes(g.rule.Verbs[0], g.rule.Resources[0])
		testutil.Eventually(t, 20*time.Second-time.Since(start), 50*time.Millisecond, func() error {
			allowed, err := reviewAccess(ctx, admin, a)
			if err != nil {
				return testutil.Stop(err)
			}
			if !allowed {
				return fmt.Errorf("%+v is still denied", a)
			}
			return nil
		}, "%s not in effect", g.source)
	}
}

// runLeaderElection takes and releases the configured Lease as hubsync
// does (a client-go Lease lock, released on cancel).
func runLeaderElection(ctx context.Context, t *testing.T, admin, kube kubernetes.Interface, c config.LeaderElection) {
	t.Helper()
	t.Cleanup(func() {
		err := admin.CoordinationV1().Leases(c.Namespace).Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete lease: %v", err)
		}
	})
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, c.Namespace, c.Name,
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: "rbac-test"})
	if err != nil {
		t.Fatalf("leader election lock: %v", err)
	}
	leCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	led := make(chan struct{})
	leaderelection.RunOrDie(leCtx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaseDuration.Duration,
		RenewDeadline:   c.RenewDeadline.Duration,
		RetryPeriod:     c.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            c.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				close(led)
				stop()
			},
			OnStoppedLeading: func() {},
		},
	})
	select {
	case <-led:
	default:
		t.Fatalf("never became leader of Lease %s/%s as %s", c.Namespace, c.Name, hubServiceAcctUser)
	}
	lease, err := admin.CoordinationV1().Leases(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Fatalf("Lease %s/%s not released: held by %q", c.Namespace, c.Name, *lease.Spec.HolderIdentity)
	}
}

// apiRequest is a resource request as the API server's authorizer sees it.
type apiRequest struct {
	verb, group, resource, subresource, namespace, name string
	// watchList is a watch that starts with the current objects, which an
	// informer sends instead of a list where the server supports it.
	watchList bool
	code      int
}

func (r apiRequest) String() string {
	s := r.verb + " " + r.group + "/" + r.resource
	if r.subresource != "" {
		s += "/" + r.subresource
	}
	if r.namespace != "" {
		s += " in " + r.namespace
	}
	if r.name != "" {
		s += " named " + r.name
	}
	return s
}

// parseRequest maps an HTTP request to the authorizer's attributes, as the
// API server's RequestInfoFactory does for the paths clients use. ok is
// false for non-resource requests such as discovery.
func parseRequest(req *http.Request) (r apiRequest, ok bool) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		r.group, rest = parts[1], parts[3:]
	}
	if len(rest) == 0 {
		return r, false
	}
	if rest[0] == "namespaces" && len(rest) >= 2 {
		r.namespace = rest[1]
		if len(rest) > 2 {
			rest = rest[2:]
		}
	}
	r.resource = rest[0]
	if len(rest) > 1 {
		r.name = rest[1]
	}
	if len(rest) > 2 {
		r.subresource = rest[2]
	}
	q := req.URL.Query()
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			r.verb = "watch"
			r.watchList = q.Get("sendInitialEvents") == "true"
		case r.name == "":
			r.verb = "list"
		default:
			r.verb = "get"
		}
		// A list or watch of one object by field selector is authorized
		// as a request for that name.
		if sel, err := fields.ParseSelector(q.Get("fieldSelector")); r.name == "" && err == nil {
			r.name, _ = sel.RequiresExactMatch("metadata.name")
		}
	case http.MethodPost:
		r.verb = "create"
	case http.MethodPut:
		r.verb = "update"
	case http.MethodPatch:
		r.verb = "patch"
	case http.MethodDelete:
		r.verb = "delete"
		if r.name == "" {
			r.verb = "deletecollection"
		}
	default:
		r.verb = strings.ToLower(req.Method)
	}
	return r, true
}

// impersonateHubsync returns a config that acts as hubsync's
// ServiceAccount, and the log of every request made through it (shown when
// the test fails). named are namespaces the log's summary shows by name.
func impersonateHubsync(t *testing.T, named ...string) (*rest.Config, *requestLog) {
	reqs := &requestLog{named: named}
	t.Cleanup(func() {
		if t.Failed() {
			reqs.logRefused(t)
		}
	})
	cfg := rest.CopyConfig(hubConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: hubServiceAcctUser}
	cfg.Wrap(reqs.wrap)
	return cfg, reqs
}

// requestLog records every request made through a wrapped transport.
type requestLog struct {
	mu          sync.Mutex
	reqs        []apiRequest
	nonResource []string // refused non-resource requests
	checked     bool
	// named are namespaces the summary shows by name besides hubsync's
	// and "default"; the others are consumer or cluster namespaces.
	named []string
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (l *requestLog) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		r, ok := parseRequest(req)
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case ok:
			r.code = resp.StatusCode
			l.reqs = append(l.reqs, r)
		case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
			l.nonResource = append(l.nonResource, req.Method+" "+req.URL.Path)
		}
		return resp, nil
	})
}

func (g grant) allows(r apiRequest) bool {
	if g.namespace != "" && r.namespace != g.namespace {
		return false
	}
	res := r.resource
	if r.subresource != "" {
		res += "/" + r.subresource
	}
	if !slices.Contains(g.rule.APIGroups, r.group) || !slices.Contains(g.rule.Resources, res) || !slices.Contains(g.rule.Verbs, r.verb) {
		return false
	}
	return len(g.rule.ResourceNames) == 0 || slices.Contains(g.rule.ResourceNames, r.name)
}

// logRefused logs the refused requests of a test that failed before
// check could report them.
func (l *requestLog) logRefused(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checked {
		return
	}
	for _, r := range l.reqs {
		if r.code == http.StatusForbidden || r.code == http.StatusUnauthorized {
			t.Logf("refused (%d): %s", r.code, r)
		}
	}
}

// check fails the test for every request the API server refused or that
// the grants do not allow, and for every permission of mustUse that no
// request used.
func (l *requestLog) check(t *testing.T, grants, mustUse []grant) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checked = true
	for _, p := range l.nonResource {
		t.Errorf("refused: %s", p)
	}
	problems := map[string]bool{}
	for _, r := range l.reqs {
		if r.code == http.StatusForbidden || r.code == http.StatusUnauthorized {
			problems[fmt.Sprintf("refused (%d): %s", r.code, r)] = true
			continue
		}
		if !allowedBy(grants, r) {
			problems["allowed by something other than deploy/: "+r.String()] = true
		}
	}
	for _, g := range mustUse {
		for _, group := range g.rule.APIGroups {
			for _, res := range g.rule.Resources {
				for _, verb := range g.rule.Verbs {
					names := g.rule.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, name := range names {
						if !l.used(g, group, res, verb, name) {
							problems[fmt.Sprintf("granted but never used: %s %s/%s %q (%s)", verb, group, res, name, g.source)] = true
						}
					}
				}
			}
		}
	}
	list := make([]string, 0, len(problems))
	for p := range problems {
		list = append(list, p)
	}
	sort.Strings(list)
	for _, p := range list {
		t.Error(p)
	}
	seen := map[string]int{}
	for _, r := range l.reqs {
		r.name = ""
		if r.namespace != "" && r.namespace != hubNamespace && r.namespace != metav1.NamespaceDefault && !slices.Contains(l.named, r.namespace) {
			r.namespace = "a consumer or cluster namespace"
		}
		if r.watchList {
			r.verb = "watch-list"
		}
		seen[fmt.Sprintf("%s -> %d", r, r.code)]++
	}
	kinds := make([]string, 0, len(seen))
	for k, n := range seen {
		kinds = append(kinds, fmt.Sprintf("%3d x %s", n, k))
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i][6:] < kinds[j][6:] })
	t.Logf("%d requests made as %s:\n  %s", len(l.reqs), hubServiceAcctUser, strings.Join(kinds, "\n  "))
}

// used reports whether a request used one permission of a grant. A
// watch-list request counts as the list it replaces: informers send one
// where the server supports it (this one does, and authorizes it as a
// watch) and fall back to a list where it does not, so list stays needed.
func (l *requestLog) used(g grant, group, res, verb, name string) bool {
	for _, r := range l.reqs {
		if r.code == http.StatusForbidden || r.code == http.StatusUnauthorized || !g.allows(r) {
			continue
		}
		full := r.resource
		if r.subresource != "" {
			full += "/" + r.subresource
		}
		if r.group != group || full != res || (name != "" && r.name != name) {
			continue
		}
		if r.verb == verb || (verb == "list" && r.watchList) {
			return true
		}
	}
	return false
}

// attributes returns the access review attributes of one verb on one
// resource ("resource" or "resource/subresource") of the grant.
func (g grant) attributes(verb, resource string) authorizationv1.ResourceAttributes {
	res, sub, _ := strings.Cut(resource, "/")
	a := authorizationv1.ResourceAttributes{Namespace: g.namespace, Verb: verb, Group: g.rule.APIGroups[0], Resource: res, Subresource: sub}
	if len(g.rule.ResourceNames) > 0 {
		a.Name = g.rule.ResourceNames[0]
	}
	return a
}

func reviewAccess(ctx context.Context, admin kubernetes.Interface, a authorizationv1.ResourceAttributes) (bool, error) {
	review, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: hubServiceAcctUser, Groups: hubServiceAcctGroups, ResourceAttributes: &a},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("review access %+v: %w", a, err)
	}
	return review.Status.Allowed, nil
}

// checkAccess asks the API server what the ServiceAccount may do: every
// permission granted, and nothing that would let it write
// ManagedServiceAccounts, change the fleet or widen its own access, nor
// anything in denied.
func checkAccess(ctx context.Context, t *testing.T, admin kubernetes.Interface, grants []grant, denied []authorizationv1.ResourceAttributes) {
	t.Helper()
	for _, g := range grants {
		for _, res := range g.rule.Resources {
			for _, verb := range g.rule.Verbs {
				a := g.attributes(verb, res)
				if ok, err := reviewAccess(ctx, admin, a); err != nil || !ok {
					t.Errorf("%s grants %+v, but the review says allowed=%v (%v)", g.source, a, ok, err)
				}
			}
		}
	}
	const (
		ocm    = "cluster.open-cluster-management.io"
		msa    = "authentication.open-cluster-management.io"
		coord  = coordinationv1.GroupName
		rbac   = rbacv1.GroupName
		consum = "consumer"
		clus   = "cluster1"
	)
	denied = append(slices.Clip(denied), []authorizationv1.ResourceAttributes{
		// ManagedServiceAccounts are only read, through an informer.
		{Verb: "get", Group: msa, Resource: "managedserviceaccounts", Namespace: clus, Name: "app"},
		{Verb: "create", Group: msa, Resource: "managedserviceaccounts", Namespace: clus},
		{Verb: "update", Group: msa, Resource: "managedserviceaccounts", Namespace: clus, Name: "app"},
		{Verb: "patch", Group: msa, Resource: "managedserviceaccounts", Namespace: clus, Name: "app"},
		{Verb: "delete", Group: msa, Resource: "managedserviceaccounts", Namespace: clus, Name: "app"},
		{Verb: "deletecollection", Group: msa, Resource: "managedserviceaccounts", Namespace: clus},
		{Verb: "update", Group: msa, Resource: "managedserviceaccounts", Subresource: "status", Namespace: clus, Name: "app"},
		{Verb: "list", Resource: "configmaps", Namespace: hubNamespace},
		{Verb: "delete", Group: ocm, Resource: "managedclusters"},
		{Verb: "create", Group: ocm, Resource: "managedclusters"},
		{Verb: "update", Group: ocm, Resource: "managedclusters"},
		{Verb: "patch", Group: ocm, Resource: "managedclusters"},
		{Verb: "update", Group: ocm, Resource: "managedclusters", Subresource: "status"},
		{Verb: "delete", Group: ocm, Resource: "managedclustersets"},
		{Verb: "create", Group: ocm, Resource: "managedclustersets", Subresource: "bind"},
		{Verb: "create", Group: ocm, Resource: "managedclustersetbindings", Namespace: consum},
		{Verb: "delete", Group: ocm, Resource: "managedclustersetbindings", Namespace: consum},
		{Verb: "deletecollection", Group: cpv1alpha1.GroupVersion.Group, Resource: "clusterprofiles", Namespace: consum},
		{Verb: "patch", Group: cpv1alpha1.GroupVersion.Group, Resource: "clusterprofiles", Namespace: consum},
		{Verb: "create", Resource: "namespaces"},
		{Verb: "delete", Resource: "namespaces", Name: consum},
		{Verb: "delete", Resource: "events", Namespace: consum},
		{Verb: "create", Resource: "pods", Namespace: hubNamespace},
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: hubNamespace, Name: hubServiceAccount},
		{Verb: "impersonate", Resource: "serviceaccounts", Namespace: hubNamespace},
		{Verb: "get", Group: coord, Resource: "leases", Namespace: "kube-system", Name: "kube-controller-manager"},
		{Verb: "update", Group: coord, Resource: "leases", Namespace: hubNamespace, Name: "another-controller"},
		{Verb: "delete", Group: coord, Resource: "leases", Namespace: hubNamespace, Name: hubServiceAccount},
		{Verb: "create", Group: coord, Resource: "leases", Namespace: metav1.NamespaceDefault},
		{Verb: "escalate", Group: rbac, Resource: "clusterroles"},
		{Verb: "bind", Group: rbac, Resource: "clusterroles"},
		{Verb: "update", Group: rbac, Resource: "roles", Namespace: hubNamespace},
	}...)
	for _, a := range denied {
		ok, err := reviewAccess(ctx, admin, a)
		if err != nil {
			t.Error(err)
			continue
		}
		if ok {
			t.Errorf("%s may %s %s/%s (subresource %q, namespace %q, name %q)", hubServiceAcctUser, a.Verb, a.Group, a.Resource, a.Subresource, a.Namespace, a.Name)
		}
	}
}

// TestDeployManifests applies every manifest that deploy/kustomization.yaml
// lists to the API server as a strict server-side dry run (unknown fields
// and invalid values are errors), and checks that the Deployment runs as
// the ServiceAccount of rbac.yaml with the configuration of config.yaml.
func TestDeployManifests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var kustomization struct {
		Resources []string `json:"resources"`
	}
	data, err := os.ReadFile(deployFile("kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &kustomization); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, err := filepath.Glob(deployFile("*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			want = append(want, base)
		}
	}
	got := slices.Sorted(slices.Values(kustomization.Resources))
	if !slices.Equal(got, want) {
		t.Fatalf("kustomization.yaml lists %v; deploy/ holds %v", got, want)
	}

	admin, err := kubernetes.NewForConfig(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(hubConfig)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(admin.Discovery())
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hubNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", hubNamespace, err)
	}
	for _, file := range kustomization.Resources {
		docs, err := yamlDocuments(deployFile(file))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range docs {
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			var obj unstructured.Unstructured
			if err := obj.UnmarshalJSON(js); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s: %v", file, gvk, err)
			}
			var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				if obj.GetNamespace() != hubNamespace {
					t.Errorf("%s: %s %s is in namespace %q, want %s", file, gvk.Kind, obj.GetName(), obj.GetNamespace(), hubNamespace)
				}
				res = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			_, err = res.Patch(ctx, obj.GetName(), types.ApplyPatchType, js, metav1.PatchOptions{
				DryRun: []string{metav1.DryRunAll}, FieldManager: "hubsync-e2e", FieldValidation: metav1.FieldValidationStrict,
			})
			if err != nil {
				t.Errorf("%s: %s %s: %v", file, gvk.Kind, obj.GetName(), err)
			}
		}
	}

	cfg := hubsyncConfig(t)
	d := loadDeploy(t, "statefulset.yaml", "config.yaml")
	var deploy *appsv1.StatefulSet
	for _, o := range d.other {
		if dep, ok := o.(*appsv1.StatefulSet); ok {
			deploy = dep
		}
	}
	if deploy == nil || len(deploy.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("statefulset.yaml: want a StatefulSet with one container")
	}
	pod := deploy.Spec.Template.Spec
	c := pod.Containers[0]
	// The NetworkPolicy selects these pods and names their ports.
	var np *networkingv1.NetworkPolicy
	for _, o := range loadDeploy(t, "networkpolicy.yaml").other {
		if p, ok := o.(*networkingv1.NetworkPolicy); ok {
			np = p
		}
	}
	if np == nil {
		t.Fatal("networkpolicy.yaml: no NetworkPolicy")
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(deploy.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy podSelector %v does not select the StatefulSet's pods %v", np.Spec.PodSelector, deploy.Spec.Template.Labels)
	}
	var npPorts []string
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			npPorts = append(npPorts, p.Port.String())
		}
	}
	for _, p := range c.Ports {
		if !slices.Contains(npPorts, p.Name) {
			t.Errorf("NetworkPolicy does not name container port %s (names %v)", p.Name, npPorts)
		}
	}
	if pod.ServiceAccountName != hubServiceAccount {
		t.Errorf("serviceAccountName = %q, want %s", pod.ServiceAccountName, hubServiceAccount)
	}
	_, port, err := net.SplitHostPort(cfg.Server.Address)
	if err != nil {
		t.Fatalf("config.yaml server.address: %v", err)
	}
	_, gwPort, err := net.SplitHostPort(cfg.Gateway.Listen)
	if err != nil {
		t.Fatalf("config.yaml gateway.listen: %v", err)
	}
	_, natsPort, err := net.SplitHostPort(cfg.Bus.Embedded.Listen)
	if err != nil {
		t.Fatalf("config.yaml bus.embedded.listen: %v", err)
	}
	_, routePort, err := net.SplitHostPort(cfg.Bus.Embedded.Cluster.Listen)
	if err != nil {
		t.Fatalf("config.yaml bus.embedded.cluster.listen: %v", err)
	}
	if len(c.Ports) != 4 || strconv.Itoa(int(c.Ports[0].ContainerPort)) != port || c.Ports[0].Name != "metrics" ||
		strconv.Itoa(int(c.Ports[1].ContainerPort)) != gwPort || c.Ports[1].Name != "gateway" ||
		strconv.Itoa(int(c.Ports[2].ContainerPort)) != natsPort || c.Ports[2].Name != "nats" ||
		strconv.Itoa(int(c.Ports[3].ContainerPort)) != routePort || c.Ports[3].Name != "nats-route" {
		t.Errorf("container ports %+v; config.yaml serves metrics on %s, the gateway on %s, the bus on %s and its routes on %s",
			c.Ports, cfg.Server.Address, cfg.Gateway.Listen, cfg.Bus.Embedded.Listen, cfg.Bus.Embedded.Cluster.Listen)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if m.MountPath == "/etc/hubsync" && i >= 0 && pod.Volumes[i].ConfigMap != nil &&
			pod.Volumes[i].ConfigMap.Name == d.configMaps[0].Name {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("ConfigMap %s is not mounted at /etc/hubsync", d.configMaps[0].Name)
	}
	if !slices.Equal(c.Args, []string{"run", "--config", "/etc/hubsync/config.yaml"}) {
		t.Errorf("args = %v", c.Args)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v", sc)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe of %s: %+v", path, probe)
		}
	}
}

// TestRBACDaemon runs the hubsync binary with deploy/config.yaml's
// configuration (leader election, the cluster-proxy access provider and
// credential copies on) and a token of the ServiceAccount, so that the
// daemon's own requests (discovery, including the ManagedServiceAccount
// API, /readyz probes, the Lease, the event recorder) are made with exactly
// rbac.yaml's permissions, and checks that it takes the Lease, converges a
// fleet, reports a conflict, writes the proxy entry once the CA Secret
// exists, copies a token and removes the copy with its profile, releases
// the Lease on exit and never logs a refusal.
func TestRBACDaemon(t *testing.T) {
	d := loadDeploy(t, "serviceaccount.yaml", "rbac.yaml")
	conf := hubsyncConfig(t)
	// One process stands in for one replica: its bus is a single node on
	// loopback (StartDaemon picks the port), since the pods' certificate
	// and their peers' routes are not here. The bus takes no part in
	// what the ServiceAccount may do (test/chart's TestInstall runs the
	// clustered bus as the chart configures it).
	conf.Bus.Embedded.Listen, conf.Bus.Embedded.TLS, conf.Bus.Embedded.Cluster = "", config.BusEmbeddedTLS{}, config.BusCluster{}
	conf.Bus.Stream.Replicas = 1
	h := newHarnessWithoutSyncer(t)
	installRBAC(h.ctx, t, h.hub.Kube, d)
	le := conf.LeaderElection
	t.Cleanup(func() {
		err := h.hub.Kube.CoordinationV1().Leases(le.Namespace).Delete(context.Background(), le.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete lease: %v", err)
		}
	})
	expiry := int64(600)
	tr, err := h.hub.Kube.CoreV1().ServiceAccounts(hubNamespace).CreateToken(h.ctx, hubServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	h.must(err)
	asHubsync := &rest.Config{Host: hubConfig.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: hubConfig.CAData}}

	ns := h.namespaces("consumer")[0]
	set := h.name("set")
	h.must(h.hub.CreateExclusiveSet(h.ctx, set))
	a, b := h.name("a"), h.name("b")
	_, err = h.hub.Profiles.ApisV1alpha1().ClusterProfiles(ns).Create(h.ctx, &cpv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: b, Namespace: ns, Labels: map[string]string{hub.LabelClusterManager: "someone-else"}},
		Spec:       cpv1alpha1.ClusterProfileSpec{DisplayName: "theirs", ClusterManager: cpv1alpha1.ClusterManager{Name: "someone-else"}},
	}, metav1.CreateOptions{})
	h.must(err)
	h.cluster(a, set, nil)
	h.cluster(b, set, nil)
	h.must(h.hub.Bind(h.ctx, ns, set, true))

	var logs fleet.LogBuffer
	daemon, err := fleet.StartDaemon(h.ctx, testutil.Hubsync(t), asHubsync, *conf, &logs)
	h.must(err)
	h.watchLog("the daemon's log", &logs)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = daemon.Stop()
		}
		if t.Failed() {
			t.Logf("hubsync logs:\n%s", logs.String())
		}
	})
	if err := daemon.WaitReady(h.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// A replica is ready as a standby once it runs, which may be a moment
	// before its first try at the lease.
	h.eventually("the Lease held", func() error {
		lease, err := h.hub.Kube.CoordinationV1().Leases(le.Namespace).Get(h.ctx, le.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("Lease %s/%s has no holder", le.Namespace, le.Name)
		}
		return nil
	})
	h.eventually("a's profile beside the foreign b", func() error {
		names, err := h.hub.ProfileNames(h.ctx, ns)
		if err != nil {
			return err
		}
		if strings.Join(names, ",") != a+","+b {
			return fmt.Errorf("profiles %v", names)
		}
		return h.checkProfile(ns, a)
	})
	h.expectEvent(ns, b, "ProfileConflict")
	proxy := caProvider(t, conf)
	putCASecret(h, *proxy.CASecret, "DAEMON-CA")
	h.expectCAEntry(proxy, ns, a, "DAEMON-CA")
	_, err = h.hub.CreateMSA(h.ctx, a, "app", true)
	h.must(err)
	tok := fleet.FakeJWT(time.Now().Add(time.Hour))
	h.must(h.hub.PutToken(h.ctx, a, "app", tok, nil))
	h.expectSecretToken(ns, a+"-app", tok)
	h.must(h.hub.DeleteCluster(h.ctx, a))
	h.expectSecretToken(ns, a+"-app", "")
	h.eventually("a's profile deleted", func() error {
		names, err := h.hub.ProfileNames(h.ctx, ns)
		if err != nil {
			return err
		}
		if strings.Join(names, ",") != b {
			return fmt.Errorf("profiles %v", names)
		}
		return nil
	})

	stopped = true
	if err := daemon.Stop(); err != nil {
		t.Fatalf("hubsync did not stop cleanly: %v", err)
	}
	lease, err := h.hub.Kube.CoordinationV1().Leases(le.Namespace).Get(h.ctx, le.Name, metav1.GetOptions{})
	h.must(err)
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Errorf("Lease not released on exit: held by %q", *lease.Spec.HolderIdentity)
	}
	if out := logs.String(); strings.Contains(strings.ToLower(out), "forbidden") {
		t.Errorf("hubsync logged a refusal:\n%s", out)
	}
}
