package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/testutil"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// Daemon is a hubsync process started from its binary, as an operator
// would run it.
type Daemon struct {
	stopOnce sync.Once
	stopErr  error
	cmd      *exec.Cmd
	dir      string
	done     chan error
	Address  string // metrics and health endpoint, host:port
	NATSURL  string // the event bus: the embedded server's, or the first external URL
	// Conf is the configuration the daemon started with, as written.
	Conf config.Config
}

// WriteKubeconfig writes a kubeconfig for cfg to path with mode 0600.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["hub"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
	}
	kc.Contexts["hub"] = &clientcmdapi.Context{Cluster: "hub", AuthInfo: "admin"}
	kc.CurrentContext = "hub"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return os.Chmod(path, 0o600)
}

// StartDaemon runs `hubsync run` against the hub with the given
// configuration, whose hub.kubeconfig and server.address it sets, sending
// the daemon's log lines to logs.
func StartDaemon(ctx context.Context, binary string, cfg *rest.Config, conf config.Config, logs io.Writer) (*Daemon, error) {
	return StartDaemonEnv(ctx, binary, cfg, conf, logs, nil)
}

// StartDaemonEnv is StartDaemon with env (KEY=value) added to the
// daemon's environment.
func StartDaemonEnv(ctx context.Context, binary string, cfg *rest.Config, conf config.Config, logs io.Writer, env []string) (*Daemon, error) {
	return startDaemon(ctx, binary, cfg, conf, logs, func(dir string, data []byte) (string, error) {
		path := filepath.Join(dir, "hubsync.yaml")
		return path, os.WriteFile(path, data, 0o600)
	}, env)
}

// ConfigMapDir is a configuration directory laid out the way the kubelet
// mounts a ConfigMap: hubsync.yaml -> ..data/hubsync.yaml, and an update
// swaps the ..data symlink to a new timestamped directory in one rename.
type ConfigMapDir struct {
	Dir     string
	version int
}

// Path is the configuration file's path, as hubsync is given it.
func (c *ConfigMapDir) Path() string { return filepath.Join(c.Dir, "hubsync.yaml") }

// Write publishes data as the new content, atomically.
func (c *ConfigMapDir) Write(data []byte) error {
	c.version++
	ts := fmt.Sprintf("..2026_11_23_00_00_%02d.%d", c.version%60, c.version)
	if err := os.Mkdir(filepath.Join(c.Dir, ts), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, ts, "hubsync.yaml"), data, 0o644); err != nil {
		return err
	}
	tmp := filepath.Join(c.Dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(c.Dir, "..data")); err != nil {
		return err
	}
	link := c.Path()
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		return os.Symlink(filepath.Join("..data", "hubsync.yaml"), link)
	}
	return nil
}

// StartDaemonConfigMap is StartDaemon with the configuration file in a
// ConfigMap-style directory, which the test then edits with
// Daemon.WriteConfig as a ConfigMap update would.
func StartDaemonConfigMap(ctx context.Context, binary string, cfg *rest.Config, conf config.Config, logs io.Writer) (*Daemon, *ConfigMapDir, error) {
	var cm *ConfigMapDir
	d, err := startDaemon(ctx, binary, cfg, conf, logs, func(dir string, data []byte) (string, error) {
		cm = &ConfigMapDir{Dir: filepath.Join(dir, "config")}
		if err := os.Mkdir(cm.Dir, 0o755); err != nil {
			return "", err
		}
		return cm.Path(), cm.Write(data)
	}, nil)
	if err != nil {
		return nil, nil, err
	}
	return d, cm, nil
}

// WriteConfig publishes conf, with the daemon's kubeconfig, addresses and
// data directory kept, as the daemon's new configuration file content.
func (d *Daemon) WriteConfig(cm *ConfigMapDir, conf config.Config) error {
	conf.Hub.Kubeconfig = d.Conf.Hub.Kubeconfig
	conf.Server.Address = d.Conf.Server.Address
	conf.Bus.Embedded = d.Conf.Bus.Embedded
	data, err := yaml.Marshal(conf)
	if err != nil {
		return err
	}
	return cm.Write(data)
}

func startDaemon(ctx context.Context, binary string, cfg *rest.Config, conf config.Config, logs io.Writer,
	write func(dir string, data []byte) (string, error), env []string) (*Daemon, error) {
	dir, err := os.MkdirTemp("", "hubsync-daemon-")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := WriteKubeconfig(cfg, kubeconfig); err != nil {
		return nil, err
	}
	// Two distinct free ports: the metrics server's and the embedded
	// NATS's (two separate picks can return the same port).
	addrs, err := freeAddresses(2)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	conf.Hub.Kubeconfig = kubeconfig
	conf.Server.Address = addr
	if len(conf.Bus.URLs) == 0 {
		// The embedded NATS gets its own free port and a data directory
		// that goes with the daemon, unless the test chose others than
		// the defaults (a node of a cluster restarted with its data): a
		// configuration from config.Default() must never share the
		// machine's port 4222 or /var/lib/hubsync with another run.
		if e := conf.Bus.Embedded; e.Listen == "" || e.Listen == config.DefaultEmbeddedListen {
			conf.Bus.Embedded.Listen = addrs[1]
		}
		if e := conf.Bus.Embedded; e.DataDir == "" || e.DataDir == config.DefaultEmbeddedDataDir {
			conf.Bus.Embedded.DataDir = filepath.Join(dir, "nats")
		}
	}
	data, err := yaml.Marshal(conf)
	if err != nil {
		return nil, err
	}
	confPath, err := write(dir, data)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, binary, "run", "--config", confPath)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = logs
	cmd.Stderr = logs
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	d := &Daemon{cmd: cmd, dir: dir, done: make(chan error, 1), Address: addr, Conf: conf}
	if len(conf.Bus.URLs) > 0 {
		d.NATSURL = conf.Bus.URLs[0]
	} else {
		d.NATSURL = "nats://" + conf.Bus.Embedded.Listen
	}
	go func() { d.done <- cmd.Wait() }()
	return d, nil
}

// Done returns a channel that receives the process's exit error once.
func (d *Daemon) Done() <-chan error { return d.done }

// WaitReady waits until /readyz answers 200.
func (d *Daemon) WaitReady(ctx context.Context, timeout time.Duration) error {
	err := testutil.Poll(ctx, timeout, 50*time.Millisecond, func() error {
		select {
		case err := <-d.done:
			return testutil.Stop(fmt.Errorf("hubsync exited before it was ready: %v", err))
		default:
		}
		resp, err := http.Get("http://" + d.Address + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hubsync not ready: %w", err)
	}
	return nil
}

// ReadyAt polls /readyz every 10 ms in the background and returns a
// channel that receives the time the daemon first answered 200.
func (d *Daemon) ReadyAt(ctx context.Context) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			resp, err := http.Get("http://" + d.Address + "/readyz")
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ch <- time.Now()
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ch
}

// Scrape reads the daemon's metrics.
func (d *Daemon) Scrape() (testutil.Metrics, error) {
	return testutil.Scrape("http://" + d.Address + "/metrics")
}

// Metrics returns the daemon's /metrics text, for printing it or looking
// for what must not be in it; Scrape reads values.
func (d *Daemon) Metrics() (string, error) {
	resp, err := http.Get("http://" + d.Address + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// PeakRSS returns the process's peak resident set size in bytes (VmHWM).
func (d *Daemon) PeakRSS() (int64, error) { return d.procStatus("VmHWM:") }

// RSS returns the process's current resident set size in bytes.
func (d *Daemon) RSS() (int64, error) { return d.procStatus("VmRSS:") }

// OpenFiles returns how many file descriptors the process holds.
func (d *Daemon) OpenFiles() (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
	return len(fds), err
}

// procStatus reads a kB field of /proc/<pid>/status, in bytes.
func (d *Daemon) procStatus(field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("%s not found", strings.TrimSuffix(field, ":"))
}

// CPUTime returns the CPU time (user + system) the process has used so far.
func (d *Daemon) CPUTime() (time.Duration, error) {
	return ProcessCPUTime(d.cmd.Process.Pid)
}

// ProcessCPUTime returns the user + system CPU time a process has used.
func ProcessCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which is in parentheses): utime and
	// stime are the 12th and 13th, in clock ticks (100 per second here).
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable /proc stat")
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// Stop sends SIGTERM and waits for the process to exit; calling it again
// returns the first call's result.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() {
		defer os.RemoveAll(d.dir)
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case d.stopErr = <-d.done:
		case <-time.After(45 * time.Second):
			_ = d.cmd.Process.Kill()
			d.stopErr = errors.New("hubsync did not stop within 45s of SIGTERM")
		}
	})
	return d.stopErr
}

// Leading reports whether the daemon says it holds the leader lease.
func (d *Daemon) Leading() bool {
	m, err := d.Scrape()
	return err == nil && m.Value("hubsync_leader", nil) == 1
}

// Kill ends the daemon with SIGKILL, as a node failure or the OOM killer
// would: no lease release, no draining.
func (d *Daemon) Kill() error {
	defer os.RemoveAll(d.dir)
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-d.done:
		return nil
	case <-time.After(15 * time.Second):
		return errors.New("hubsync did not exit within 15s of SIGKILL")
	}
}

// freeAddresses returns n distinct free loopback addresses: every
// listener stays open until all are picked, so no port is handed out twice.
func freeAddresses(n int) ([]string, error) {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// ProcessRunTime returns the CPU time a process's threads have run, to the
// nanosecond, from /proc/<pid>/task/*/schedstat; threads that have exited
// are not counted (Go's runtime seldom ends one). ProcessCPUTime, in 10 ms
// ticks, when the kernel keeps no schedstat.
func ProcessRunTime(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread has just exited
			}
			return ProcessCPUTime(pid)
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return ProcessCPUTime(pid)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return ProcessCPUTime(pid)
		}
		total += time.Duration(ns)
	}
	return total, nil
}
