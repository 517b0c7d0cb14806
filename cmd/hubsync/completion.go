package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"
)

// commandNames are the commands the usage lists, in its order.
func commandNames() []string {
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  hubsync ([a-z][a-z-]*)`).FindAllStringSubmatch(usage, -1) {
		names = append(names, m[1])
	}
	return names
}

// The completion scripts complete command names, and a command's flags
// from what `hubsync COMMAND -h` lists, so that they never fall behind
// the flags themselves.
const bashCompletion = `# hubsync completion for bash (and zsh, after: autoload -U +X bashcompinit && bashcompinit)
_hubsync() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    local flags
    flags=$("${COMP_WORDS[0]}" "${COMP_WORDS[1]}" -h 2>&1 | sed -n 's/^  -\([a-z][a-z0-9-]*\).*/--\1/p')
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o default -F _hubsync hubsync
`

const fishCompletion = `# hubsync completion for fish
complete -c hubsync -f -n __fish_use_subcommand -a "%s"
complete -c hubsync -n 'not __fish_use_subcommand' -a '(hubsync (commandline -opc)[2] -h 2>&1 | string replace -rf "^  -([a-z][a-z0-9-]*).*" -- "--\$1")'
`

// completionCommand prints a shell's completion script.
func completionCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh" && args[0] != "fish") {
		fmt.Fprintln(stderr, "usage: hubsync completion bash|zsh|fish\n\n"+
			"  bash: source <(hubsync completion bash)\n"+
			"  zsh:  autoload -U +X bashcompinit && bashcompinit; source <(hubsync completion zsh)\n"+
			"  fish: hubsync completion fish | source")
		if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return errUsage
	}
	names := strings.Join(commandNames(), " ")
	var err error
	if args[0] == "fish" {
		_, err = fmt.Fprintf(stdout, fishCompletion, names)
	} else {
		_, err = fmt.Fprintf(stdout, bashCompletion, names)
	}
	return err
}
