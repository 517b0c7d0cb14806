package events

import (
	"testing"

	"github.com/hubsync/hubsync/stream"
)

func TestParseType(t *testing.T) {
	for _, tc := range []struct {
		in, kind, full string
		err            bool
	}{
		{in: ""},
		{in: "profile", kind: "profile"},
		{in: "io.hubsync.credential", kind: "credential"},
		{in: "accessprovider", kind: "accessprovider"},
		{in: "credential.rotated", kind: "credential", full: stream.CredentialRotated},
		{in: stream.ProfileDeleted, kind: "profile", full: stream.ProfileDeleted},
		{in: "accessprovider.updated", kind: "accessprovider", full: stream.AccessProviderUpdated},
		{in: "tunnel", kind: "tunnel"},
		{in: "tunnel.failing", kind: "tunnel", full: stream.TunnelFailing},
		{in: "io.hubsync.tunnel.ready", kind: "tunnel", full: stream.TunnelReady},
		{in: "tunnel.down", err: true},
		{in: "Profile", err: true},
	} {
		kind, full, err := ParseType(tc.in)
		if (err != nil) != tc.err || kind != tc.kind || full != tc.full {
			t.Errorf("ParseType(%q) = %q, %q, %v; want %q, %q, error %v", tc.in, kind, full, err, tc.kind, tc.full, tc.err)
		}
	}
}
