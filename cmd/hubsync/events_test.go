package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/hub"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/fleet"
	"github.com/hubsync/hubsync/test/testutil"
)

// startNATS runs a real nats-server with JetStream on a random loopback
// port for the test and returns its URL and a JetStream client.
func startNATS(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return s.ClientURL(), js
}

// createBus creates the stream and bucket as hubsync's defaults name them.
func createBus(t *testing.T, js jetstream.JetStream) (jetstream.Stream, jetstream.KeyValue) {
	t.Helper()
	ctx := context.Background()
	cfg := config.Default().Bus
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: cfg.Stream.Name, Subjects: []string{cfg.SubjectPrefix + ".>"},
		MaxAge: cfg.Stream.MaxAge.Duration, Duplicates: cfg.Stream.DuplicateWindow.Duration,
	})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.KVBucket})
	if err != nil {
		t.Fatal(err)
	}
	return stream, kv
}

// publish sends a change the way hubsync does: the encoded event on its
// subject, with its id as Nats-Msg-Id. It returns the event's JSON.
func publish(t *testing.T, js jetstream.JetStream, c stream.Change) []byte {
	t.Helper()
	data, err := events.Encode(c, "hubsync/open-cluster-management")
	if err != nil {
		t.Fatal(err)
	}
	if err := events.ValidateEvent(data); err != nil {
		t.Fatalf("the test's event is not valid: %v\n%s", err, data)
	}
	kind, err := events.Kind(c.Type)
	if err != nil {
		t.Fatal(err)
	}
	subject := events.Subject(config.Default().Bus.SubjectPrefix, c.Namespace, c.Cluster, kind)
	if _, err := js.Publish(context.Background(), subject, data, jetstream.WithMsgID(events.ID(c))); err != nil {
		t.Fatal(err)
	}
	return data
}

var t0 = time.Date(2026, 11, 21, 4, 0, 0, 0, time.UTC)

func profileChange(typ, ns, cluster string, minute int) stream.Change {
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: cluster, ResourceVersion: fmt.Sprint(100 + minute),
		Time: t0.Add(time.Duration(minute) * time.Minute),
		Profile: &stream.ProfileSummary{
			KubernetesVersion: "v1.35.4", Healthy: "True", Joined: "True",
			AccessProviders: []stream.AccessProviderSummary{{Name: "open-cluster-management", Server: "https://proxy:9092/" + cluster}},
		},
	}
}

func credentialChange(typ, ns, cluster, fp string, minute int) stream.Change {
	exp := t0.Add(24 * time.Hour)
	return stream.Change{
		Type: typ, Namespace: ns, Cluster: cluster, Name: cluster + "-kueue", ResourceVersion: fmt.Sprint(200 + minute),
		Time: t0.Add(time.Duration(minute) * time.Minute),
		Credential: &stream.CredentialSummary{
			ManagedServiceAccount: "kueue", Secret: cluster + "-kueue", ResourceVersion: fmt.Sprint(200 + minute),
			Fingerprint: fp, Expiration: &exp,
		},
	}
}

func run(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Main(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestEventsCommand(t *testing.T) {
	url, js := startNATS(t)
	createBus(t, js)

	// The first batch, then (after mid) the second.
	fpA, fpB := hub.TokenFingerprint([]byte("token a")), hub.TokenFingerprint([]byte("token b"))
	created := profileChange(stream.ProfileCreated, "team-ml", "eu-prod-01", 0)
	for _, c := range []stream.Change{
		created,
		profileChange(stream.ProfileCreated, "team-ml", "edge.eu-1", 1),
		credentialChange(stream.CredentialSynced, "team-ml", "eu-prod-01", fpA, 2),
		created, // published twice: JetStream keeps it once
	} {
		publish(t, js, c)
	}
	// A message that is not an event is skipped, not fatal.
	if _, err := js.Publish(context.Background(), "hubsync.team-ml.eu-prod-01.profile", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	mid := time.Now().UTC().Format(time.RFC3339Nano)
	time.Sleep(10 * time.Millisecond)
	rotated := publish(t, js, credentialChange(stream.CredentialRotated, "team-ml", "eu-prod-01", fpB, 3))
	for _, c := range []stream.Change{
		profileChange(stream.ProfileUpdated, "team-web", "eu-prod-01", 4),
		profileChange(stream.AccessProviderUpdated, "team-ml", "edge.eu-1", 5),
		{Type: stream.ProfileDeleted, Namespace: "team-web", Cluster: "eu-prod-01", Name: "eu-prod-01",
			ResourceVersion: "106", Time: t0.Add(6 * time.Minute), Profile: &stream.ProfileSummary{}},
	} {
		publish(t, js, c)
	}

	lines := map[string]string{
		"created":   "2026-11-21T04:00:00Z profile.created        team-ml/eu-prod-01  v1.35.4 healthy=True providers=open-cluster-management",
		"edge":      "2026-11-21T04:01:00Z profile.created        team-ml/edge.eu-1  v1.35.4 healthy=True providers=open-cluster-management",
		"synced":    "2026-11-21T04:02:00Z credential.synced      team-ml/eu-prod-01  secret=eu-prod-01-kueue fp=" + fpA + " expires=2026-11-22T04:00:00Z",
		"rotated":   "2026-11-21T04:03:00Z credential.rotated     team-ml/eu-prod-01  secret=eu-prod-01-kueue fp=" + fpB + " expires=2026-11-22T04:00:00Z",
		"web":       "2026-11-21T04:04:00Z profile.updated        team-web/eu-prod-01  v1.35.4 healthy=True providers=open-cluster-management",
		"providers": "2026-11-21T04:05:00Z accessprovider.updated team-ml/edge.eu-1  v1.35.4 healthy=True providers=open-cluster-management",
		"deleted":   "2026-11-21T04:06:00Z profile.deleted        team-web/eu-prod-01",
	}
	want := func(names ...string) string {
		var b strings.Builder
		for _, n := range names {
			b.WriteString(lines[n] + "\n")
		}
		return b.String()
	}
	replay := []string{"events", "--server", url, "--follow=false"}
	runCLICases(t, []cliCase{
		{name: "everything", args: append(replay, "--since", "0"),
			wantStdout: want("created", "edge", "synced", "rotated", "web", "providers", "deleted"),
			wantStderr: "skipping a message on hubsync.team-ml.eu-prod-01.profile: not a hubsync event"},
		{name: "--all", args: append(replay, "--all", "--namespace", "team-web"), wantStdout: want("web", "deleted")},
		{name: "by namespace", args: append(replay, "--since", "0", "--namespace", "team-web"), wantStdout: want("web", "deleted")},
		{name: "by escaped cluster", args: append(replay, "--since", "0", "--cluster", "edge.eu-1"), wantStdout: want("edge", "providers")},
		{name: "by namespace and cluster", args: append(replay, "--since", "0", "--namespace", "team-ml", "--cluster", "eu-prod-01"),
			wantStdout: want("created", "synced", "rotated")},
		{name: "by kind", args: append(replay, "--since", "0", "--type", "credential"), wantStdout: want("synced", "rotated")},
		{name: "by short type", args: append(replay, "--since", "0", "--type", "profile.created"), wantStdout: want("created", "edge")},
		{name: "by full type", args: append(replay, "--since", "0", "--type", stream.AccessProviderUpdated), wantStdout: want("providers")},
		{name: "by type in a namespace", args: append(replay, "--since", "0", "--type", "profile.deleted", "--namespace", "team-ml")},
		{name: "since a time", args: append(replay, "--since", mid), wantStdout: want("rotated", "web", "providers", "deleted")},
		{name: "since a duration", args: append(replay, "--since", "1h", "--type", "profile.updated"), wantStdout: want("web")},
		{name: "since the future", args: append(replay, "--since", time.Now().Add(time.Hour).Format(time.RFC3339))},
		{name: "json", args: append(replay, "--since", "0", "-o", "json", "--type", "credential.rotated"), wantStdout: string(rotated) + "\n"},
		{name: "config file", args: []string{"events", "--config", writeConfig(t, "bus:\n  urls: ["+url+"]\n"), "--since", "0", "--follow=false", "--type", "credential.synced"},
			wantStdout: want("synced")},

		{name: "unknown type", args: append(replay, "--since", "0", "--type", "profile.renamed"), wantCode: 2, wantStderr: `--type: unknown event type "profile.renamed"`},
		{name: "bad since", args: append(replay, "--since", "yesterday"), wantCode: 2, wantStderr: `--since "yesterday"`},
		{name: "negative since", args: append(replay, "--since", "-5m"), wantCode: 2, wantStderr: "must not be negative"},
		{name: "no follow and nothing to replay", args: replay, wantCode: 2, wantStderr: "--follow=false needs --since or --all"},
		{name: "bad output", args: append(replay, "--all", "-o", "yaml"), wantCode: 2, wantStderr: `-o "yaml"`},
		{name: "stray argument", args: append(replay, "--all", "extra"), wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "creds and nkey", args: append(replay, "--all", "--creds", "a", "--nkey", "b"), wantCode: 1, wantStderr: "mutually exclusive"},
		{name: "cert without key", args: append(replay, "--all", "--tls-cert", "a"), wantCode: 1, wantStderr: "go together"},
		{name: "missing nkey seed", args: append(replay, "--all", "--nkey", "/nonexistent/seed"), wantCode: 1, wantStderr: "/nonexistent/seed"},
	})

	t.Run("json lines are valid events", func(t *testing.T) {
		code, stdout, stderr := run(context.Background(), append(replay, "--all", "-o", "json")...)
		if code != 0 {
			t.Fatalf("exit code %d: %s", code, stderr)
		}
		got := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(got) != 7 {
			t.Fatalf("%d lines, want 7:\n%s", len(got), stdout)
		}
		for _, line := range got {
			if err := events.ValidateEvent([]byte(line)); err != nil {
				t.Errorf("%v\n%s", err, line)
			}
		}
	})
}

// cliCase is one run of the command line and what it must print.
type cliCase struct {
	name       string
	args       []string
	wantCode   int
	wantStdout string // all of stdout, checked when wantCode is 0
	wantStderr string // a part of stderr
}

func runCLICases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(context.Background(), tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, stdout, stderr)
			}
			if tc.wantCode == 0 && stdout != tc.wantStdout {
				t.Errorf("stdout:\n%s\nwant:\n%s", stdout, tc.wantStdout)
			}
			if !strings.Contains(stderr, tc.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderr, stderr)
			}
		})
	}
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	return writeFile(t, t.TempDir(), "hubsync.yaml", content)
}

func TestEventsFollow(t *testing.T) {
	url, js := startNATS(t)
	createBus(t, js)
	publish(t, js, profileChange(stream.ProfileCreated, "team-ml", "old", 0))

	// The default: new events only, following until interrupted.
	out := follow(t, []string{"events", "--server", url, "--type", "profile"}, "team-ml/new", func(minute int) {
		publish(t, js, credentialChange(stream.CredentialSynced, "team-ml", "new", "", minute)) // filtered out
		publish(t, js, profileChange(stream.ProfileUpdated, "team-ml", "new", minute))
	})
	if strings.Contains(out, "team-ml/old") || strings.Contains(out, "credential") {
		t.Errorf("printed an old or filtered event:\n%s", out)
	}
}

func TestStateCommand(t *testing.T) {
	url, js := startNATS(t)
	_, kv := createBus(t, js)
	exp1, exp2 := t0.Add(24*time.Hour), t0.Add(2*time.Hour)
	fp := hub.TokenFingerprint([]byte("token"))
	for _, r := range []bus.Record{
		{Namespace: "team-web", Cluster: "eu-prod-01", Updated: t0,
			Profile:     &stream.ProfileSummary{KubernetesVersion: "v1.34.4", Healthy: "False"},
			Credentials: []stream.CredentialSummary{}},
		{Namespace: "team-ml", Cluster: "eu-prod-01", Updated: t0,
			Profile: &stream.ProfileSummary{KubernetesVersion: "v1.35.4", Healthy: "True", AccessProviders: []stream.AccessProviderSummary{
				{Name: "open-cluster-management", Server: "https://proxy:9092/eu-prod-01"}, {Name: "direct", Server: "https://eu-prod-01:6443"},
			}},
			Credentials: []stream.CredentialSummary{
				{ManagedServiceAccount: "argocd", Secret: "eu-prod-01-argocd", Fingerprint: fp, Expiration: &exp1},
				{ManagedServiceAccount: "kueue", Secret: "eu-prod-01-kueue", Fingerprint: fp, Expiration: &exp2},
			}},
		{Namespace: "team-ml", Cluster: "edge.eu-1", Updated: t0,
			Profile:     &stream.ProfileSummary{},
			Credentials: []stream.CredentialSummary{{ManagedServiceAccount: "kueue", Secret: "edge.eu-1-kueue"}}},
	} {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.ValidateRecord(data); err != nil {
			t.Fatalf("the test's record is not valid: %v", err)
		}
		if _, err := kv.Put(context.Background(), events.KVKey(r.Namespace, r.Cluster), data); err != nil {
			t.Fatal(err)
		}
	}
	// A deleted record is not listed.
	if _, err := kv.Put(context.Background(), events.KVKey("team-gone", "eu-prod-01"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), events.KVKey("team-gone", "eu-prod-01")); err != nil {
		t.Fatal(err)
	}

	table := "NAMESPACE  CLUSTER     K8S      HEALTHY  PROVIDERS                       CREDENTIALS\n" +
		"team-ml    edge.eu-1   -        -        -                               1\n" +
		"team-ml    eu-prod-01  v1.35.4  True     open-cluster-management,direct  2, next expiry 2026-11-21T06:00:00Z\n" +
		"team-web   eu-prod-01  v1.34.4  False    -                               0\n"
	runCLICases(t, []cliCase{
		{name: "table", args: []string{"state", "--server", url}, wantStdout: table},
		{name: "one namespace", args: []string{"state", "--server", url, "--namespace", "team-web"},
			wantStdout: "NAMESPACE  CLUSTER     K8S      HEALTHY  PROVIDERS  CREDENTIALS\n" +
				"team-web   eu-prod-01  v1.34.4  False    -          0\n"},
		{name: "empty namespace", args: []string{"state", "--server", url, "--namespace", "team-none"},
			wantStdout: "NAMESPACE  CLUSTER  K8S  HEALTHY  PROVIDERS  CREDENTIALS\n"},
		{name: "bad output", args: []string{"state", "--server", url, "-o", "yaml"}, wantCode: 2, wantStderr: `-o "yaml"`},
	})

	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := run(context.Background(), "state", "--server", url, "-o", "json")
		if code != 0 {
			t.Fatalf("exit code %d: %s", code, stderr)
		}
		var records []json.RawMessage
		if err := json.Unmarshal([]byte(stdout), &records); err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		var got []string
		for _, r := range records {
			if err := events.ValidateRecord(r); err != nil {
				t.Errorf("%v\n%s", err, r)
			}
			var rec bus.Record
			if err := json.Unmarshal(r, &rec); err != nil {
				t.Fatal(err)
			}
			got = append(got, rec.Namespace+"/"+rec.Cluster)
		}
		if want := "team-ml/edge.eu-1 team-ml/eu-prod-01 team-web/eu-prod-01"; strings.Join(got, " ") != want {
			t.Errorf("records %v, want %s", got, want)
		}
	})
}

func TestBusUnavailable(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "nats://" + l.Addr().String()
	l.Close()
	// A server without hubsync's stream and bucket.
	bare, _ := startNATS(t)

	for _, tc := range []struct {
		name       string
		args       []string
		wantStderr []string
	}{
		{name: "events, unreachable", args: []string{"events", "--server", closed, "--all"},
			wantStderr: []string{"cannot reach NATS at " + closed, "is hubsync running with the bus enabled?"}},
		{name: "state, unreachable", args: []string{"state", "--server", closed},
			wantStderr: []string{"cannot reach NATS at " + closed, "is hubsync running with the bus enabled?"}},
		{name: "password not shown", args: []string{"state", "--server", strings.Replace(closed, "nats://", "nats://me:s3cret@", 1)},
			wantStderr: []string{"cannot reach NATS at nats://REDACTED@"}},
		{name: "token in the URL not shown", args: []string{"events", "--all", "--server", strings.Replace(closed, "nats://", "nats://s3cret-t0ken@", 1)},
			wantStderr: []string{"cannot reach NATS at nats://REDACTED@"}},
		{name: "token in a URL without a scheme not shown", args: []string{"state", "--server", "s3cret-t0ken@" + strings.TrimPrefix(closed, "nats://")},
			wantStderr: []string{"cannot reach NATS at REDACTED@"}},
		{name: "missing token file", args: []string{"state", "--server", closed, "--token-file", "/nonexistent/token"},
			wantStderr: []string{"token file", "/nonexistent/token"}},
		{name: "token file and credentials", args: []string{"state", "--server", closed, "--token-file", writeFile(t, t.TempDir(), "token", "s3cret-t0ken"), "--creds", "user.creds"},
			wantStderr: []string{"give one"}},
		{name: "default server from a config", args: []string{"state", "--config", writeConfig(t, "bus:\n  embedded:\n    listen: "+strings.TrimPrefix(closed, "nats://")+"\n")},
			wantStderr: []string{"cannot reach NATS at " + closed}},
		{name: "token in an unparseable URL not shown", args: []string{"state", "--server", strings.Replace(closed, "nats://", "nats://s3cret-t0ken@", 1) + "x"},
			wantStderr: []string{"is not a URL"}},
		{name: "tokens in a list of URLs not shown", args: []string{"events", "--all", "--server", strings.Replace(closed, "nats://", "nats://s3cret-t0ken@", 1) + "," +
			strings.Replace(closed, "nats://", "nats://me:s3cret@", 1)},
			wantStderr: []string{"cannot reach NATS at nats://REDACTED@" + strings.TrimPrefix(closed, "nats://") + ",nats://REDACTED@"}},
		{name: "bus.requireTLS refuses a server without TLS", args: []string{"state", "--config", writeConfig(t, "bus:\n  urls: ['"+bare+"']\n  requireTLS: true\n")},
			wantStderr: []string{"cannot reach NATS at " + bare, "secure connection not available"}},
		{name: "no stream", args: []string{"events", "--server", bare, "--all"},
			wantStderr: []string{`stream "HUBSYNC_EVENTS" not found on ` + bare + ": is hubsync running with the bus enabled?"}},
		{name: "no bucket", args: []string{"state", "--server", bare},
			wantStderr: []string{`key-value bucket "hubsync-access" not found on ` + bare + ": is hubsync running with the bus enabled?"}},
		{name: "bad config", args: []string{"events", "--config", writeConfig(t, "bus:\n  kvBucket: a.b\n")},
			wantStderr: []string{"bus.kvBucket"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := run(context.Background(), tc.args...)
			if code != 1 {
				t.Fatalf("exit code %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stderr, "s3cret") {
				t.Errorf("stderr shows a secret:\n%s", stderr)
			}
			if d := time.Since(start); d > 2*busTimeout {
				t.Errorf("took %v to fail", d)
			}
		})
	}
}

func TestEventsHelpers(t *testing.T) {
	now := time.Date(2026, 11, 21, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  bool
	}{
		{in: "0"},
		{in: "10m", want: now.Add(-10 * time.Minute)},
		{in: "2026-11-20T04:00:00Z", want: now.Add(-24 * time.Hour)},
		{in: "2026-11-21T05:00:00+01:00", want: now},
		{in: "-1h", err: true},
		{in: "10", err: true},
		{in: "2026-11-20", err: true},
	} {
		got, err := parseSince(tc.in, now)
		if (err != nil) != tc.err || !got.Equal(tc.want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	for _, tc := range []struct{ ns, cluster, kind, want string }{
		{want: "hubsync.*.*.*"},
		{ns: "team-ml", want: "hubsync.team-ml.*.*"},
		{cluster: "edge.eu-1", kind: "credential", want: "hubsync.*.edge%2Eeu-1.credential"},
		{ns: "team-ml", cluster: "eu-prod-01", kind: "profile", want: "hubsync.team-ml.eu-prod-01.profile"},
	} {
		q := bus.EventQuery{Namespace: tc.ns, Cluster: tc.cluster, Kind: tc.kind}
		if got := q.Subject("hubsync"); got != tc.want {
			t.Errorf("subject of %+v = %q, want %q", q, got, tc.want)
		}
	}
	for in, want := range map[string]string{"127.0.0.1:4222": "127.0.0.1:4222", ":4222": "127.0.0.1:4222", "0.0.0.0:4222": "127.0.0.1:4222", "[::]:4222": "127.0.0.1:4222", "nats.local:4222": "nats.local:4222"} {
		bc := config.Default().Bus
		bc.Embedded.Listen = in
		if got := bus.ConsumerURLs(bc); len(got) != 1 || got[0] != "nats://"+want {
			t.Errorf("ConsumerURLs(listen %q) = %q, want nats://%s", in, got, want)
		}
	}
}

// runningBus is hubsync's bus with its embedded server, as the daemon
// runs it.
type runningBus struct {
	url string // the embedded server's loopback URL
	fan *stream.Fanout
	bus *bus.Bus
	// events and keys count what the bus has published.
	events int
	keys   map[string]bool
}

func runBus(t *testing.T, cfg config.Bus) *runningBus {
	t.Helper()
	cfg.Embedded.Listen = "127.0.0.1:0"
	cfg.Embedded.DataDir = t.TempDir()
	b, err := bus.New(cfg, "hubsync/open-cluster-management", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	fan, err := stream.NewFanout(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fan.Add(b.ConsumerOptions(), b); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fan.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fan.Close(ctx); _ = b.Close() })
	return &runningBus{url: b.ClientURL(), fan: fan, bus: b, keys: map[string]bool{}}
}

// publish has the bus publish the changes and waits until it has.
func (r *runningBus) publish(t *testing.T, changes ...stream.Change) {
	t.Helper()
	for _, c := range changes {
		r.fan.Notify(c)
		r.events++
		r.keys[events.KVKey(c.Namespace, c.Cluster)] = true
	}
	if err := r.fan.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The commands read the local consumer's copies, which the server
	// fills from hubsync's stream and bucket.
	testutil.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, c := range r.bus.Copies(context.Background()) {
			if c.Consumer != config.LocalConsumer {
				continue
			}
			if c.Err != nil || c.Events != uint64(r.events) || c.Records != uint64(len(r.keys)) {
				return fmt.Errorf("the local consumer's copies: %d events, %d records (%v); want %d and %d", c.Events, c.Records, c.Err, r.events, len(r.keys))
			}
		}
		return nil
	}, "the copies current")
}

const consumerToken = "c0nsumer-t0ken-0123456789abcdef"

// TestAgainstBus reads what hubsync's own bus publishes, as a consumer of
// its embedded server: the commands and the publisher agree on subjects,
// escaping, stream, bucket and keys, and the commands need nothing a
// consumer may not do. With a token configured they present it from
// --token-file, the URL or hubsync's configuration, and are refused
// without it.
func TestAgainstBus(t *testing.T) {
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "token", consumerToken+"\n")
	wrongFile := writeFile(t, dir, "wrong", "guess\n")
	fp := hub.TokenFingerprint([]byte("token"))
	changes := []stream.Change{
		profileChange(stream.ProfileCreated, "team-ml", "edge.eu-1", 0),
		credentialChange(stream.CredentialSynced, "team-ml", "edge.eu-1", fp, 1),
		profileChange(stream.ProfileCreated, "team-web", "eu-prod-01", 2),
	}
	wantEvents := "2026-11-21T04:00:00Z profile.created        team-ml/edge.eu-1  v1.35.4 healthy=True providers=open-cluster-management\n" +
		"2026-11-21T04:01:00Z credential.synced      team-ml/edge.eu-1  secret=edge.eu-1-kueue fp=" + fp + " expires=2026-11-22T04:00:00Z\n"
	wantState := "NAMESPACE  CLUSTER    K8S      HEALTHY  PROVIDERS                CREDENTIALS\n" +
		"team-ml    edge.eu-1  v1.35.4  True     open-cluster-management  1, next expiry 2026-11-22T04:00:00Z\n"
	withToken := func(tok string) func(string) []string {
		return func(url string) []string {
			return []string{"--server", strings.Replace(url, "nats://", "nats://"+tok+"@", 1)}
		}
	}
	type connection struct {
		name    string
		flags   func(url string) []string
		refused bool
	}
	for _, setup := range []struct {
		name        string
		token       bool // the bus is configured with the token
		connections []connection
	}{
		{name: "no token configured", connections: []connection{
			{name: "no credential", flags: func(url string) []string { return []string{"--server", url} }},
		}},
		{name: "token configured", token: true, connections: []connection{
			{name: "--token-file", flags: func(url string) []string { return []string{"--server", url, "--token-file", tokenFile} }},
			{name: "the token in the URL", flags: withToken(consumerToken)},
			{name: "hubsync's configuration", flags: func(url string) []string {
				listen := strings.TrimPrefix(url, "nats://")
				return []string{"--config", writeConfig(t, "bus:\n  embedded: {listen: '"+listen+"', authTokenFile: "+tokenFile+"}\n")}
			}},
			{name: "no token", flags: func(url string) []string { return []string{"--server", url} }, refused: true},
			{name: "a wrong token", flags: func(url string) []string { return []string{"--server", url, "--token-file", wrongFile} }, refused: true},
			{name: "a wrong token in the URL", flags: withToken("guess"), refused: true},
		}},
	} {
		t.Run(setup.name, func(t *testing.T) {
			cfg := config.Default().Bus
			if setup.token {
				cfg.Embedded.AuthTokenFile = tokenFile
			}
			b := runBus(t, cfg)
			b.publish(t, changes...)
			for _, conn := range setup.connections {
				t.Run(conn.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					for _, cmd := range []struct {
						args []string
						want string
					}{
						{append([]string{"events", "--all", "--follow=false", "--cluster", "edge.eu-1"}, conn.flags(b.url)...), wantEvents},
						{append([]string{"state", "--namespace", "team-ml"}, conn.flags(b.url)...), wantState},
					} {
						code, stdout, stderr := run(ctx, cmd.args...)
						if strings.Contains(stderr, consumerToken) {
							t.Errorf("%s: stderr shows the token:\n%s", cmd.args[0], stderr)
						}
						if conn.refused {
							if code != 1 || !strings.Contains(stderr, "Authorization Violation") {
								t.Errorf("%s: exit code %d, stderr:\n%s\nwant 1 and an authorization violation", cmd.args[0], code, stderr)
							}
							continue
						}
						if code != 0 || stdout != cmd.want {
							t.Errorf("%s: exit code %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", cmd.args[0], code, stdout, cmd.want, stderr)
						}
					}
				})
			}
		})
	}
}

// TestEventsFollowAsConsumer follows hubsync's own bus as a consumer with
// the token: new events arrive through the ordered consumer.
func TestEventsFollowAsConsumer(t *testing.T) {
	tokenFile := writeFile(t, t.TempDir(), "token", consumerToken+"\n")
	cfg := config.Default().Bus
	cfg.Embedded.AuthTokenFile = tokenFile
	b := runBus(t, cfg)
	b.publish(t, profileChange(stream.ProfileCreated, "team-ml", "old", 0)) // creates the stream

	out := follow(t, []string{"events", "--server", b.url, "--token-file", tokenFile, "--namespace", "team-ml"}, "team-ml/live", func(minute int) {
		b.publish(t, profileChange(stream.ProfileUpdated, "team-ml", "live", minute))
	})
	if strings.Contains(out, "team-ml/old") {
		t.Errorf("printed an event from before the command started:\n%s", out)
	}
}

// TestEventsTunnel: tunnel events are listed, filtered by kind or type,
// and printed with their state, transport, reason and probe time.
func TestEventsTunnel(t *testing.T) {
	url, js := startNATS(t)
	createBus(t, js)
	tunnel := func(typ string, minute int, ts stream.TunnelSummary) stream.Change {
		return stream.Change{Type: typ, Namespace: "team-ml", Cluster: "eu-prod-01", Name: "eu-prod-01", ResourceVersion: fmt.Sprint(minute),
			Time: t0.Add(time.Duration(minute) * time.Minute), Tunnel: &ts}
	}
	for _, c := range []stream.Change{
		profileChange(stream.ProfileCreated, "team-ml", "eu-prod-01", 0),
		tunnel(stream.TunnelFailing, 1, stream.TunnelSummary{State: "failing", Transport: "konnectivity",
			Reason: "dial eu-prod-01:443: No agent available", Since: t0.Add(time.Minute)}),
		tunnel(stream.TunnelReady, 2, stream.TunnelSummary{State: "ready", Transport: "konnectivity", ProbeMillis: 2.5, Since: t0.Add(2 * time.Minute)}),
	} {
		publish(t, js, c)
	}
	failing := "2026-11-21T04:01:00Z tunnel.failing         team-ml/eu-prod-01  state=failing transport=konnectivity " +
		`reason="dial eu-prod-01:443: No agent available" since=2026-11-21T04:01:00Z` + "\n"
	ready := "2026-11-21T04:02:00Z tunnel.ready           team-ml/eu-prod-01  state=ready transport=konnectivity probe=2.5ms since=2026-11-21T04:02:00Z\n"
	replay := []string{"events", "--server", url, "--follow=false", "--all"}
	runCLICases(t, []cliCase{
		{name: "the kind", args: append(replay, "--type", "tunnel"), wantStdout: failing + ready},
		{name: "a type", args: append(replay, "--type", "tunnel.failing"), wantStdout: failing},
		{name: "a full type", args: append(replay, "--type", stream.TunnelReady), wantStdout: ready},
	})
}

// follow runs the following command args until it prints want, publishing
// with publish (minute 1, 2, ...) meanwhile: the command's consumer exists
// only once it is waiting, and an event published before may predate it.
// It then interrupts the command, checks it stops with exit code 0, and
// returns what it printed.
func follow(t *testing.T, args []string, want string, publish func(minute int)) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr fleet.LogBuffer
	done := make(chan int, 1)
	go func() { done <- Main(ctx, args, &stdout, &stderr) }()
	minute := 0
	testutil.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		select {
		case code := <-done:
			return testutil.Stop(fmt.Errorf("exited early with %d: %s", code, stderr.String()))
		default:
		}
		if strings.Contains(stdout.String(), want) {
			return nil
		}
		minute++
		publish(minute)
		return fmt.Errorf("%q not printed yet", want)
	}, "following %v\nstdout:\n%s\nstderr:\n%s", args, &stdout, &stderr)
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d after interrupt: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not stop when interrupted")
	}
	return stdout.String()
}

// TestBusConfigReadsOnlyTheBus: `hubsync events --config` on a machine
// that has none of the daemon's files (a laptop) takes the bus section,
// whatever else the file names; an invalid file is still refused.
func TestBusConfigReadsOnlyTheBus(t *testing.T) {
	dir := t.TempDir()
	daemonOnly := writeFile(t, dir, "daemon.yaml", "bus: {urls: ['nats://bus.example:4222'], stream: {name: MY_EVENTS}}\n"+
		"tunnel: {enabled: true, transport: direct, managedServiceAccount: gw}\n"+
		"gateway: {enabled: true, listen: ':8443', url: 'https://gw.example:8443', tls: {certFile: /nonexistent/tls.crt, keyFile: /nonexistent/tls.key}}\n")
	b := busFlags{configFile: daemonOnly}
	bc, err := b.busConfig()
	if err != nil {
		t.Fatalf("busConfig: %v", err)
	}
	if bc.Stream.Name != "MY_EVENTS" || len(bc.URLs) != 1 {
		t.Errorf("bus section %+v", bc)
	}
	b = busFlags{configFile: writeFile(t, dir, "bad.yaml", "bus: {urls: 3}\n")}
	if _, err := b.busConfig(); err == nil || !strings.Contains(err.Error(), "bus.urls") {
		t.Errorf("an invalid file: %v; want its problem at bus.urls", err)
	}
}
