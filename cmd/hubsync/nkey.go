package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/bus"
	"github.com/hubsync/hubsync/sinks"
)

// nkeyCommand makes the NKey of a consuming application of the bus: it
// writes the seed, which signs the application in and stays with it, to a
// file (0600, written atomically, never over an existing file), and prints
// the public key with the entry of bus.consumers that admits it.
func nkeyCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hubsync nkey", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seedFile := fs.String("seed-file", "", "write the seed here (required; an existing file is not overwritten)")
	name := fs.String("name", "my-app", "the application's name in the printed bus.consumers entry")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync nkey --seed-file FILE [--name NAME]")
		fmt.Fprintln(stderr, "Makes an NKey for an application that reads the bus: the seed goes to FILE (keep it")
		fmt.Fprintln(stderr, "with the application, e.g. in its Secret); the public key goes into bus.consumers.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *seedFile == "" || fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	if _, err := os.Lstat(*seedFile); err == nil {
		return fmt.Errorf("%s exists: not overwritten (a seed is a credential; remove it first if it is no longer used)", *seedFile)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return fmt.Errorf("make an NKey: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	if err := sinks.WriteFileAtomic(*seedFile, append(seed, '\n')); err != nil {
		return fmt.Errorf("write the seed: %w", err)
	}
	fmt.Fprintf(stdout, "%s\n\n# The seed is in %s (mode 0600). Admit the application in hubsync's configuration:\nbus:\n  consumers:\n  - name: %s\n    nkeys: [%s]\n    namespaces: []  # the namespaces it reads; empty: all\n", pub, *seedFile, *name, pub)
	return nil
}

// busAccountsCommand prints the accounts block of an external NATS for a
// configuration's bus: hubsync's user in the writer account, and each
// application of bus.consumers in an account of its own with its NKeys
// and hubsync's provisioning user. Public keys only: it holds no secret.
func busAccountsCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hubsync bus-accounts", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: hubsync bus-accounts FILE")
		fmt.Fprintln(stderr, "Prints the accounts an external NATS needs for the bus of configuration FILE (bus.urls,")
		fmt.Fprintln(stderr, "bus.nkeySeedFile, bus.consumers), in nats-server's syntax: include it from the servers'")
		fmt.Fprintln(stderr, "configuration, then check with hubsync check-config --connect FILE.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfigArg(fs)
	if err != nil {
		return err
	}
	out, err := bus.AccountsConfig(cfg.Bus)
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	_, err = stdout.Write(out)
	return err
}
