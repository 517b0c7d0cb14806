package fleet

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// TCPConnections counts the established TCP connections process pid holds
// to remote (host:port, IPv4): the sockets among its file descriptors
// that /proc/net/tcp lists as ESTABLISHED to that address.
func TCPConnections(pid int, remote string) (int, error) {
	want, err := procAddr(remote)
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[3] != "01" || fs[2] != want {
			continue
		}
		inodes["socket:["+fs[9]+"]"] = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(dir + "/" + fd.Name()); err == nil && inodes[target] {
			n++
		}
	}
	return n, nil
}

// TCPConnections counts the established TCP connections the daemon holds
// to remote (host:port).
func (d *Daemon) TCPConnections(remote string) (int, error) {
	return TCPConnections(d.cmd.Process.Pid, remote)
}

// procAddr writes host:port as /proc/net/tcp does: the IPv4 address's
// bytes in host (little-endian) order, then the port, in upper-case hex.
func procAddr(hostport string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", err
	}
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return "", fmt.Errorf("%s: not an IPv4 address", hostport)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", fmt.Errorf("%s: %w", hostport, err)
	}
	le := []byte{ip[3], ip[2], ip[1], ip[0]}
	return strings.ToUpper(hex.EncodeToString(le)) + fmt.Sprintf(":%04X", p), nil
}
