// Command hubsync is the hubsync daemon and its helper commands.
//
// It holds flags and command wiring only: the daemon is package daemon,
// events and their text form package events, NATS access bus.Client, a
// running daemon's summary package status.
// Nothing imports it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	// The Mozilla roots, used only where the system has none: the image
	// is built from scratch (no base image, no CA bundle), and a webhook
	// sink or an external NATS may still be verified by a public CA.
	_ "golang.org/x/crypto/x509roots/fallback"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/hubsync/hubsync/daemon"
)

const usage = `hubsync keeps an Open Cluster Management hub's ClusterProfiles in step with its fleet.

Usage:
  hubsync run [--config FILE] [--kubeconfig FILE]   run the daemon (--log-level, --log-format override the file)
  hubsync check-config [--connect] FILE             validate a configuration file (and an external NATS's accounts)
  hubsync creds --managed-serviceaccount=NAME       exec credential plugin (cp-creds compatible)
  hubsync kubeconfig --cluster=C [--sa=NAME]        write a kubeconfig reaching C through the gateway (--from-profile NS: its URL and CA from C's profile)
  hubsync hub-token [--kubeconfig FILE]             exec plugin: your hub identity's token, for the gateway
  hubsync events [--since 10m] [--namespace NS]     print cluster-access events from the NATS bus
  hubsync state [--namespace NS]                    print the current access records from the NATS bus
  hubsync nkey --seed-file FILE                     make the NKey of an application that reads the bus
  hubsync bus-accounts FILE                         print the accounts an external NATS needs for FILE's bus
  hubsync status [--address HOST:PORT] [-o json]    sum up a running daemon: leader, consumers, sinks, tunnels, gateway
  hubsync completion bash|zsh|fish                   print a shell completion script
  hubsync install DIR                               copy this binary to DIR (an init container's way to hand the plugin to a consumer)
  hubsync version [-o json]                         print the version, commit, build date and Go version

Run "hubsync COMMAND -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(Main(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs one command and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runCommand(ctx, args[1:], stderr, daemon.Run)
	case "check-config":
		err = checkConfigCommand(ctx, args[1:], stdout, stderr)
	case "creds":
		err = credsCommand(ctx, args[1:], stdout, stderr)
	case "kubeconfig":
		err = kubeconfigCommand(ctx, args[1:], stdout, stderr)
	case "hub-token":
		err = hubTokenCommand(ctx, args[1:], stdout, stderr)
	case "events":
		err = eventsCommand(ctx, args[1:], stdout, stderr)
	case "state":
		err = stateCommand(ctx, args[1:], stdout, stderr)
	case "status":
		err = statusCommand(ctx, args[1:], stdout, stderr)
	case "nkey":
		err = nkeyCommand(args[1:], stdout, stderr)
	case "bus-accounts":
		err = busAccountsCommand(args[1:], stdout, stderr)
	case "completion":
		err = completionCommand(args[1:], stdout, stderr)
	case "install":
		err = installCommand(args[1:], stdout, stderr)
	case "version", "--version":
		err = versionCommand(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "hubsync: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	return exitCode(err, stderr)
}

// exitCode is the process exit code of a command's error: 0 for none or a
// help request, 2 for a usage error (already explained), else 1 with the
// error on stderr.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintln(stderr, "hubsync:", describe(err))
		return 1
	}
}

// describe puts each of an aggregate's errors (such as every problem in a
// configuration file) on its own line.
func describe(err error) string {
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return err.Error()
	}
	prefix := strings.TrimSuffix(err.Error(), agg.Error())
	var b strings.Builder
	fmt.Fprintf(&b, "%s%d problems:", prefix, len(agg.Errors()))
	for _, e := range agg.Errors() {
		fmt.Fprintf(&b, "\n  - %v", e)
	}
	return b.String()
}

var errUsage = errors.New("usage")

// parseFlags parses a subcommand's flags: -h is help, any other flag error
// is a usage error (the flag package has already printed it).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}
