package kubelet

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
	remotecommandserver "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// routes are the kubelet API paths the kube-apiserver uses for pod
// subresources (pkg/registry/core/pod in Kubernetes), with and without
// the pod UID segment the kubelet also accepts.
func (k *Kubelet) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", k.serveExec)
	mux.HandleFunc("/exec/{ns}/{pod}/{uid}/{container}", k.serveExec)
	mux.HandleFunc("/attach/{ns}/{pod}/{container}", k.serveAttach)
	mux.HandleFunc("/attach/{ns}/{pod}/{uid}/{container}", k.serveAttach)
	mux.HandleFunc("/portForward/{ns}/{pod}", k.servePortForward)
	mux.HandleFunc("/portForward/{ns}/{pod}/{uid}", k.servePortForward)
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", k.serveLogs)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	return mux
}

func (k *Kubelet) newRequest(kind Kind, req *http.Request) Request {
	r := Request{
		Kind: kind, Namespace: req.PathValue("ns"), Pod: req.PathValue("pod"), Container: req.PathValue("container"),
		Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Upgrade: req.Header.Get("Upgrade"),
		Protocols: req.Header.Values("X-Stream-Protocol-Version"), UserAgent: req.UserAgent(), Header: req.Header.Clone(), Time: time.Now(),
	}
	for _, v := range req.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			r.Protocols = append(r.Protocols, strings.TrimSpace(p))
		}
	}
	return r
}

func (k *Kubelet) serveExec(w http.ResponseWriter, req *http.Request) {
	r := k.newRequest(KindExec, req)
	r.Command = req.URL.Query()["command"]
	k.record(r)
	opts, err := remotecommandserver.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	remotecommandserver.ServeExec(w, req, containers{k}, r.Pod, types.UID(req.PathValue("uid")), r.Container, r.Command,
		opts, k.opts.StreamIdleTimeout, k.opts.StreamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

func (k *Kubelet) serveAttach(w http.ResponseWriter, req *http.Request) {
	r := k.newRequest(KindAttach, req)
	k.record(r)
	opts, err := remotecommandserver.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	remotecommandserver.ServeAttach(w, req, containers{k}, r.Pod, types.UID(req.PathValue("uid")), r.Container,
		opts, k.opts.StreamIdleTimeout, k.opts.StreamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

func (k *Kubelet) servePortForward(w http.ResponseWriter, req *http.Request) {
	r := k.newRequest(KindPortForward, req)
	k.record(r)
	opts, err := portforward.NewV4Options(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, req, containers{k}, r.Pod, types.UID(req.PathValue("uid")),
		opts, k.opts.StreamIdleTimeout, k.opts.StreamCreationTimeout, portforward.SupportedProtocols)
}

// serveLogs writes Options.LogLines numbered lines,
// "<namespace>/<pod>/<container> line <n>", and with follow=true one more
// every Options.LogInterval until the client goes away.
func (k *Kubelet) serveLogs(w http.ResponseWriter, req *http.Request) {
	r := k.newRequest(KindLogs, req)
	r.Follow = req.URL.Query().Get("follow") == "true"
	k.record(r)
	w.Header().Set("Content-Type", "text/plain")
	rc := http.NewResponseController(w)
	line := func(n int) error {
		if _, err := fmt.Fprintf(w, "%s/%s/%s line %d\n", r.Namespace, r.Pod, r.Container, n); err != nil {
			return err
		}
		return rc.Flush()
	}
	n := 1
	for ; n <= k.opts.LogLines; n++ {
		if line(n) != nil {
			return
		}
	}
	if !r.Follow {
		return
	}
	tick := time.NewTicker(k.opts.LogInterval)
	defer tick.Stop()
	for ; ; n++ {
		select {
		case <-req.Context().Done():
			return
		case <-tick.C:
		}
		if line(n) != nil {
			return
		}
	}
}

// containers is the fake container runtime behind the kubelet's streaming
// handlers.
type containers struct{ k *Kubelet }

// ExecInContainer runs cmd, one of:
//
//	echo ARGS...  writes ARGS joined by spaces and a newline to stdout
//	cat           copies stdin to stdout until EOF
//	exit N        exits with status N
//	hostname      writes the pod's name and a newline
//
// Anything else writes "<cmd>: command not found" to stderr and exits
// with status 127.
func (c containers) ExecInContainer(ctx context.Context, pod string, _ types.UID, _ string, cmd []string,
	in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	go drain(ctx, resize)
	stdout := writerOrDiscard(out)
	stderr := writerOrDiscard(errOut)
	if tty && errOut == nil {
		stderr = stdout // a terminal has one output stream
	}
	if len(cmd) == 0 {
		_, _ = io.WriteString(stderr, "no command\n")
		return utilexec.CodeExitError{Err: fmt.Errorf("no command"), Code: 127}
	}
	switch cmd[0] {
	case "echo":
		_, err := io.WriteString(stdout, strings.Join(cmd[1:], " ")+"\n")
		return err
	case "hostname":
		_, err := io.WriteString(stdout, pod+"\n")
		return err
	case "cat":
		if in == nil {
			return nil
		}
		return copyContext(ctx, stdout, in)
	case "exit":
		code := 0
		if len(cmd) > 1 {
			n, err := strconv.Atoi(cmd[1])
			if err != nil || n < 0 || n > 255 {
				_, _ = fmt.Fprintf(stderr, "exit: %s: numeric argument (0-255) required\n", cmd[1])
				return utilexec.CodeExitError{Err: fmt.Errorf("bad exit status %q", cmd[1]), Code: 2}
			}
			code = n
		}
		if code == 0 {
			return nil
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("exit status %d", code), Code: code}
	default:
		_, _ = fmt.Fprintf(stderr, "%s: command not found\n", cmd[0])
		return utilexec.CodeExitError{Err: fmt.Errorf("%s: command not found", cmd[0]), Code: 127}
	}
}

// AttachContainer echoes stdin to stdout until stdin ends; without stdin
// it stays attached (printing nothing) until the client or kubelet goes
// away.
func (c containers) AttachContainer(ctx context.Context, _ string, _ types.UID, _ string,
	in io.Reader, out, _ io.WriteCloser, _ bool, resize <-chan remotecommand.TerminalSize) error {
	go drain(ctx, resize)
	if in == nil {
		<-ctx.Done()
		return nil
	}
	return copyContext(ctx, writerOrDiscard(out), in)
}

// PortForward connects stream to Options.PortForwardTarget, whatever the
// port, until the target closes its side.
func (c containers) PortForward(_ context.Context, pod string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	// The streaming code passes context.Background(); the kubelet's
	// context ends forwarded connections on Close.
	ctx := c.k.ctx
	target := c.k.opts.PortForwardTarget
	if target == "" {
		return fmt.Errorf("fake kubelet: no port-forward target configured (pod %s, port %d)", pod, port)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return fmt.Errorf("fake kubelet: pod %s port %d: %w", pod, port, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(stream, conn)
	return nil
}

// copyContext copies src to dst until EOF (nil), an error or ctx is done.
// On ctx done the copy goroutine ends when the caller closes the streams.
func copyContext(ctx context.Context, dst io.Writer, src io.Reader) error {
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(dst, src)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain consumes terminal resize events, which nothing here uses.
func drain(ctx context.Context, resize <-chan remotecommand.TerminalSize) {
	if resize == nil {
		return
	}
	for {
		select {
		case _, ok := <-resize:
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func writerOrDiscard(w io.WriteCloser) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
