// Package konnectivity runs the real konnectivity proxy-server and agents
// (sigs.k8s.io/apiserver-network-proxy v0.36.0, built from pinned modules
// by test/tools/build-konnectivity.sh) the way OCM cluster-proxy deploys
// them: the server in gRPC mode with mutual TLS for clients and agents and
// the destHost strategy, one agent per managed cluster identified by
// host=<address>. StartServers runs several servers sharing one CA, as
// cluster-proxy runs several replicas (--server-count) behind one
// Service; an agent reaches one server directly (Server.StartAgent) or
// several through a load balancer in front of their agent ports
// (Server.StartAgentVia with a test/lb balancer).
package konnectivity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/controlplane"
	"github.com/hubsync/hubsync/test/pki"
	"github.com/hubsync/hubsync/test/testutil"
)

// BinDir returns the directory holding proxy-server and proxy-agent:
// $KONNECTIVITY_ASSETS when set, else the output of the repository's
// cached builder.
func BinDir() (string, error) {
	return controlplane.ToolDir("KONNECTIVITY_ASSETS", "build-konnectivity.sh")
}

// process is a binary that can be stopped and started again with the
// same arguments.
type process struct {
	name string
	bin  string
	args []string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) start() error {
	logs, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		_ = logs.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logs.Close()
		close(p.done)
	}()
	return nil
}

// kill ends the process at once (SIGKILL), as a crash or a lost node
// would.
func (p *process) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

func (p *process) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Server is a running proxy-server.
type Server struct {
	// ID is the server's --server-id.
	ID string
	// ClientAddress is the gRPC address for clients such as hubsync;
	// AgentAddress the one agents connect to.
	ClientAddress, AgentAddress string
	// HealthAddress serves /healthz, and /readyz, which answers 200 once
	// at least one agent is connected to this server.
	HealthAddress string
	// CAFile, CertFile and KeyFile are a client's mutual-TLS files; the
	// servers of one StartServers call share them.
	CAFile, CertFile, KeyFile string
	// ServingCertFile and ServingKeyFile are the server's own certificate
	// (for 127.0.0.1), for a test's proxy in front of it.
	ServingCertFile, ServingKeyFile string

	dir  string
	ca   *pki.CA
	proc process
}

// serverFiles are the certificates that the servers of one deployment
// share: one CA, one serving certificate (for 127.0.0.1) used for both
// clients and agents, and hubsync's client certificate.
type serverFiles struct {
	ca                                       *pki.CA
	caFile, cert, key, clientCert, clientKey string
}

func writeServerFiles(dir string) (*serverFiles, error) {
	ca, err := pki.NewCA("konnectivity-ca")
	if err != nil {
		return nil, err
	}
	f := &serverFiles{ca: ca}
	if f.caFile, err = ca.WriteCA(dir, "ca"); err != nil {
		return nil, err
	}
	serving, err := ca.Serving("127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	if f.cert, f.key, err = serving.Write(dir, "proxy-server"); err != nil {
		return nil, err
	}
	client, err := ca.Client("hubsync")
	if err != nil {
		return nil, err
	}
	if f.clientCert, f.clientKey, err = client.Write(dir, "hubsync"); err != nil {
		return nil, err
	}
	return f, nil
}

// StartServer starts a proxy-server on loopback with a fresh CA, keeping
// its files in dir.
func StartServer(ctx context.Context, dir string) (*Server, error) {
	f, err := writeServerFiles(dir)
	if err != nil {
		return nil, err
	}
	return startServer(ctx, dir, f, "hubsync-test", 1, "proxy-server.log")
}

// StartServers starts n proxy-servers on loopback, each on its own ports
// with --server-count=n and its own --server-id (hubsync-test-1 ...), all
// with one fresh CA, one serving certificate and one client certificate
// kept in dir, like the replicas of one cluster-proxy deployment. A
// client reaches any of them with the same files. On an error, servers
// already started are killed.
func StartServers(ctx context.Context, dir string, n int) ([]*Server, error) {
	f, err := writeServerFiles(dir)
	if err != nil {
		return nil, err
	}
	var servers []*Server
	for i := 1; i <= n; i++ {
		s, err := startServer(ctx, dir, f, fmt.Sprintf("hubsync-test-%d", i), n, fmt.Sprintf("proxy-server-%d.log", i))
		if err != nil {
			for _, s := range servers {
				s.Kill()
			}
			return nil, err
		}
		servers = append(servers, s)
	}
	return servers, nil
}

func startServer(ctx context.Context, dir string, f *serverFiles, id string, count int, logName string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	s := &Server{
		ID: id, ClientAddress: addr(0), AgentAddress: addr(1), HealthAddress: addr(2),
		CAFile: f.caFile, CertFile: f.clientCert, KeyFile: f.clientKey, dir: dir, ca: f.ca,
		ServingCertFile: f.cert, ServingKeyFile: f.key,
	}
	s.proc = process{name: "proxy-server " + id, bin: filepath.Join(bin, "proxy-server"), log: filepath.Join(dir, logName), args: []string{
		"--mode=grpc", "--uds-name=",
		"--server-bind-address=127.0.0.1", "--server-port=" + strconv.Itoa(ports[0]),
		"--server-cert=" + f.cert, "--server-key=" + f.key, "--server-ca-cert=" + f.caFile,
		"--agent-bind-address=127.0.0.1", "--agent-port=" + strconv.Itoa(ports[1]),
		"--cluster-cert=" + f.cert, "--cluster-key=" + f.key, "--cluster-ca-cert=" + f.caFile,
		"--health-bind-address=127.0.0.1", "--health-port=" + strconv.Itoa(ports[2]),
		"--admin-bind-address=127.0.0.1", "--admin-port=" + strconv.Itoa(ports[3]),
		"--proxy-strategies=destHost", "--server-count=" + strconv.Itoa(count), "--server-id=" + id,
		"--keepalive-time=30s", "--frontend-keepalive-time=30s",
	}}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts the server (again, after Kill) on the same ports and waits
// until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	if err := s.proc.start(); err != nil {
		return err
	}
	return waitListening(ctx, s.proc, s.ClientAddress, s.AgentAddress)
}

// Kill stops the server at once.
func (s *Server) Kill() { s.proc.kill() }

// Log is the server's log file.
func (s *Server) Log() string { return s.proc.log }

// Agent is a running proxy-agent.
type Agent struct {
	ID    string
	Hosts []string
	proc  process
}

// StartAgent starts an agent that serves hosts (its host= identifiers)
// and reaches them directly, connected to this server only; it
// reconnects to a restarted server within about a second.
func (s *Server) StartAgent(id string, hosts ...string) (*Agent, error) {
	return s.StartAgentVia(s.AgentAddress, id, hosts...)
}

// StartAgentVia starts an agent like StartAgent that connects to the
// proxy-servers at address (host:port): a load balancer in front of the
// AgentAddress of several servers of one StartServers call, as agents
// reach cluster-proxy's replicas through one Service. The agent opens
// connections through it until it holds one to as many distinct servers
// as --server-count says (connections landing on a server it has already
// are closed), so it ends up connected to every server behind address.
func (s *Server) StartAgentVia(address, id string, hosts ...string) (*Agent, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("agent %s: proxy-server address: %w", id, err)
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	pair, err := s.ca.Client("agent-" + id)
	if err != nil {
		return nil, err
	}
	cert, key, err := pair.Write(s.dir, "agent-"+id)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(hosts))
	for i, h := range hosts {
		ids[i] = "host=" + h
	}
	a := &Agent{ID: id, Hosts: hosts}
	a.proc = process{name: "proxy-agent " + id, bin: filepath.Join(bin, "proxy-agent"), log: filepath.Join(s.dir, "agent-"+id+".log"), args: []string{
		"--proxy-server-host=" + host, "--proxy-server-port=" + port,
		"--ca-cert=" + s.CAFile, "--agent-cert=" + cert, "--agent-key=" + key,
		"--agent-identifiers=" + strings.Join(ids, "&"), "--agent-id=" + id,
		"--health-server-host=127.0.0.1", "--health-server-port=" + strconv.Itoa(ports[0]),
		"--admin-bind-address=127.0.0.1", "--admin-server-port=" + strconv.Itoa(ports[1]),
		"--sync-interval=100ms", "--sync-interval-cap=1s", "--probe-interval=100ms", "--keepalive-time=30s",
	}}
	if err := a.proc.start(); err != nil {
		return nil, err
	}
	return a, nil
}

// Kill stops the agent at once.
func (a *Agent) Kill() { a.proc.kill() }

// Start starts the agent again after Kill.
func (a *Agent) Start() error { return a.proc.start() }

// Running reports whether the agent's process runs.
func (a *Agent) Running() bool { return a.proc.running() }

// waitListening waits until every address accepts TCP connections.
func waitListening(ctx context.Context, p process, addrs ...string) error {
	start := time.Now()
	for _, addr := range addrs {
		err := testutil.Poll(ctx, 60*time.Second-time.Since(start), 50*time.Millisecond, func() error {
			select {
			case <-p.done:
				return testutil.Stop(fmt.Errorf("%s exited; see %s", p.name, p.log))
			default:
			}
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			return c.Close()
		})
		if err != nil {
			return fmt.Errorf("%s does not listen on %s (see %s): %w", p.name, addr, p.log, err)
		}
	}
	return nil
}

// freePorts picks n free loopback ports from 20000-32000: the
// proxy-server refuses ports above 49151, where the kernel's ephemeral
// ports (":0") usually are.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("no %d free ports in 20000-32000", n)
	}
	return ports, nil
}

// TunnelConfig is hubsync's tunnel section for this proxy-server, with
// msa's token authenticating probes: each cluster is dialed at the
// host:port of its ManagedCluster URL (the agents here register their
// managed API server's address), with the short probe interval and
// backoff tests use.
func (s *Server) TunnelConfig(msa string) config.Tunnel {
	return config.Tunnel{
		Enabled: true, Transport: config.TunnelKonnectivity, ManagedServiceAccount: msa,
		Konnectivity: config.Konnectivity{
			Address: s.ClientAddress, CAFile: s.CAFile, CertFile: s.CertFile, KeyFile: s.KeyFile,
			DialAddress: "{{.ServerHost}}",
		},
		ProbeInterval: metav1.Duration{Duration: time.Second}, ProbeTimeout: metav1.Duration{Duration: 900 * time.Millisecond},
		Backoff: config.Retry{BaseDelay: metav1.Duration{Duration: 100 * time.Millisecond}, MaxDelay: metav1.Duration{Duration: time.Second}},
	}
}
