package outage

import (
	"os"
	"testing"

	"github.com/hubsync/hubsync/test/testutil"
)

// Each test starts a control plane of its own (see the package comment),
// so the package shares only the binaries testutil builds once.
func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }
