package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Transports select how kubectl 1.35 streams. Over WebSocket (its
// default) the kube-apiserver translates exec and attach to SPDY with a
// client of its own (the kubelet sees Go's User-Agent) and tunnels
// port-forward's SPDY frames through the WebSocket; with the variables
// set, kubectl speaks SPDY and the kube-apiserver proxies the upgrade
// (the kubelet sees kubectl's User-Agent).
var Transports = []struct {
	Name      string
	Env       []string
	WebSocket bool
}{
	{"websocket", nil, true},
	{"spdy", []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false", "KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}, false},
}

// Suite runs the real kubectl's streaming commands against pod (served by
// k) through whatever kc's kubeconfig reaches: exec, attach and
// port-forward over each of Transports, then logs and logs -f. Each
// checks kubectl's output and that the kubelet got exactly the request.
func Suite(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod) {
	pod, err := pod.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range Transports {
		t.Run(tr.Name, func(t *testing.T) {
			t.Run("exec", func(t *testing.T) { testExec(ctx, t, k, kc, pod, tr.Env, tr.WebSocket) })
			t.Run("attach", func(t *testing.T) { testAttach(ctx, t, k, kc, pod, tr.Env, tr.WebSocket) })
			t.Run("port-forward", func(t *testing.T) { testPortForward(ctx, t, k, kc, pod, tr.Env, tr.WebSocket) })
		})
	}
	t.Run("logs", func(t *testing.T) { testLogs(ctx, t, k, kc, pod) })
	t.Run("logs-follow", func(t *testing.T) { testLogsFollow(ctx, t, k, kc, pod) })
	if t.Failed() {
		for _, r := range k.Requests() {
			t.Logf("kubelet request: %+v", r)
		}
	}
}

func testExec(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod, env []string, websocket bool) {
	cases := []struct {
		name           string
		args           []string
		stdin          string
		stdout, stderr string
		code           int
	}{
		{name: "echo", args: []string{"exec", pod.Name, "--", "echo", "a", "b"}, stdout: "a b\n"},
		{name: "cat", args: []string{"exec", "-i", pod.Name, "--", "cat"}, stdin: "hello\nworld\n", stdout: "hello\nworld\n"},
		{name: "exit", args: []string{"exec", pod.Name, "--", "exit", "3"}, code: 3},
		{name: "not found", args: []string{"exec", pod.Name, "--", "nosuch", "x"}, stderr: "nosuch: command not found\n", code: 127},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := k.Count(KindExec)
			res, err := kc.run(ctx, env, c.stdin, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			if res.code != c.code || res.stdout != c.stdout || !strings.HasPrefix(res.stderr, c.stderr) {
				t.Errorf("kubectl %s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr starting %q",
					strings.Join(c.args, " "), res.code, res.stdout, res.stderr, c.code, c.stdout, c.stderr)
			}
			if n := k.Count(KindExec) - before; n != 1 {
				t.Errorf("kubelet got %d exec requests, want 1", n)
			}
			checkTranslated(t, k, KindExec, websocket)
		})
	}
}

// checkTranslated checks that the last request of kind came from the
// kube-apiserver's WebSocket-to-SPDY translator when kubectl used
// WebSocket, and straight from kubectl (proxied) when it used SPDY.
func checkTranslated(t *testing.T, k *Kubelet, kind Kind, websocket bool) {
	t.Helper()
	var last Request
	for _, r := range k.Requests() {
		if r.Kind == kind {
			last = r
		}
	}
	if translated := !strings.HasPrefix(last.UserAgent, "kubectl/"); translated != websocket {
		t.Errorf("kubelet %s request with User-Agent %q: translated from WebSocket = %t, want %t", kind, last.UserAgent, translated, websocket)
	}
}

func testAttach(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod, env []string, websocket bool) {
	before := k.Count(KindAttach)
	res, err := kc.run(ctx, env, "one\ntwo\n", "attach", "-i", pod.Name, "-c", pod.Container)
	if err != nil {
		t.Fatal(err)
	}
	if res.code != 0 || res.stdout != "one\ntwo\n" {
		t.Errorf("kubectl attach: exit %d, stdout %q, stderr %q; want exit 0, stdout %q", res.code, res.stdout, res.stderr, "one\ntwo\n")
	}
	if n := k.Count(KindAttach) - before; n != 1 {
		t.Errorf("kubelet got %d attach requests, want 1", n)
	}
	checkTranslated(t, k, KindAttach, websocket)
}

var forwarding = regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) -> 80$`)

func testPortForward(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod, env []string, websocket bool) {
	before := k.Count(KindPortForward)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// -v=4 logs which dialer client-go uses (to stderr).
	p, err := kc.start(ctx, env, "-v=4", "port-forward", "--address", "127.0.0.1", "pod/"+pod.Name, ":80")
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop(t)
	// kubectl prints the local port it listens on once it listens.
	var port string
	for port == "" {
		line, err := p.line(ctx)
		if err != nil {
			t.Fatalf("waiting for kubectl port-forward to listen: %v; stderr: %s", err, p.stderr())
		}
		if m := forwarding.FindStringSubmatch(line); m != nil {
			port = m[1]
		}
	}
	// Two connections over the one forwarding session.
	for i := range 2 {
		msg := fmt.Sprintf("ping %d\n", i)
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(conn).ReadString('\n')
		_ = conn.Close()
		if err != nil || got != msg {
			t.Fatalf("through port-forward: got %q, %v; want %q; kubectl stderr: %s", got, err, msg, p.stderr())
		}
	}
	if n := k.Count(KindPortForward) - before; n != 1 {
		t.Errorf("kubelet got %d port-forward requests, want 1 (one session for both connections)", n)
	}
	// The kube-apiserver hands the kubelet the same SPDY request either
	// way, so the transport shows only on kubectl's side.
	stderr := p.stderr()
	tunneled := strings.Contains(stderr, "Before WebSocket Upgrade Connection") && !strings.Contains(stderr, "fallback to secondary dialer")
	if tunneled != websocket {
		t.Errorf("kubectl port-forward over WebSocket = %t, want %t; stderr:\n%s", tunneled, websocket, stderr)
	}
}

func testLogs(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod) {
	before := k.Count(KindLogs)
	res, err := kc.run(ctx, nil, "", "logs", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	prefix := pod.Namespace + "/" + pod.Name + "/" + pod.Container
	want := prefix + " line 1\n" + prefix + " line 2\n" + prefix + " line 3\n"
	if res.code != 0 || res.stdout != want {
		t.Errorf("kubectl logs: exit %d, stdout %q, stderr %q; want %q", res.code, res.stdout, res.stderr, want)
	}
	if n := k.Count(KindLogs) - before; n != 1 {
		t.Errorf("kubelet got %d log requests, want 1", n)
	}
}

func testLogsFollow(ctx context.Context, t *testing.T, k *Kubelet, kc *Kubectl, pod Pod) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p, err := kc.start(ctx, nil, "logs", "-f", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop(t)
	// Three lines at once, then one per LogInterval: reading more than
	// three proves the stream stays open.
	for n := 1; n <= 6; n++ {
		line, err := p.line(ctx)
		if err != nil {
			t.Fatalf("line %d of kubectl logs -f: %v; stderr: %s", n, err, p.stderr())
		}
		if want := fmt.Sprintf("%s/%s/%s line %d", pod.Namespace, pod.Name, pod.Container, n); line != want {
			t.Fatalf("kubectl logs -f line %d: %q, want %q", n, line, want)
		}
	}
	var follows int
	for _, r := range k.Requests() {
		if r.Kind == KindLogs && r.Follow {
			follows++
		}
	}
	if follows != 1 {
		t.Errorf("kubelet got %d followed log requests, want 1", follows)
	}
}

// Kubectl runs the kubectl binary Bin with Kubeconfig, in Namespace, and
// an empty Home (no ~/.kube/cache or kuberc from the machine).
type Kubectl struct {
	Bin, Kubeconfig, Home, Namespace string
}

type result struct {
	stdout, stderr string
	code           int
}

func (kc *Kubectl) command(ctx context.Context, env []string, args ...string) *exec.Cmd {
	args = append([]string{"--kubeconfig", kc.Kubeconfig, "--namespace", kc.Namespace}, args...)
	cmd := exec.CommandContext(ctx, kc.Bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") && !strings.HasPrefix(e, "HOME=") && !strings.HasPrefix(e, "KUBECTL_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(append(cmd.Env, "HOME="+kc.Home), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs kubectl to completion; a non-zero exit is a result, not an
// error.
func (kc *Kubectl) run(ctx context.Context, env []string, stdin string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := kc.command(ctx, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ctx.Err() == nil) {
		return result{}, fmt.Errorf("kubectl %s: %w; stderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}, nil
}

// process is a long-running kubectl whose stdout is read line by line.
type process struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{} // stdout ended
	mu    sync.Mutex
	errb  bytes.Buffer
}

func (kc *Kubectl) start(ctx context.Context, env []string, args ...string) (*process, error) {
	p := &process{cmd: kc.command(ctx, env, args...), lines: make(chan string, 100), done: make(chan struct{})}
	p.cmd.Stderr = lockedWriter{&p.mu, &p.errb}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kubectl %s: %w", strings.Join(args, " "), err)
	}
	go func() {
		defer close(p.done)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.lines <- s.Text()
		}
	}()
	return p, nil
}

// line returns the next line of stdout.
func (p *process) line(ctx context.Context) (string, error) {
	select {
	case l := <-p.lines:
		return l, nil
	case <-p.done:
		select {
		case l := <-p.lines:
			return l, nil
		default:
			return "", errors.New("kubectl's stdout ended")
		}
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (p *process) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errb.String()
}

// stop kills kubectl and waits for it.
func (p *process) stop(t *testing.T) {
	_ = p.cmd.Process.Kill()
	go func() {
		for range p.lines {
		}
	}()
	_ = p.cmd.Wait()
	<-p.done
	close(p.lines)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// StartEcho starts a TCP server that echoes what it reads, the target of
// every forwarded port.
func StartEcho(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_, _ = io.Copy(conn, conn)
			}()
		}
	}()
	return ln.Addr().String()
}
