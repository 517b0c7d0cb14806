package webhook

import (
	"strings"
	"testing"

	"github.com/hubsync/hubsync/config"
)

// TestNewSinkRefusesUndefaultedConfig: the sink has no defaults of its
// own (config fills them), so a section left unfilled is refused by name
// rather than spooled into the working directory or posted without a
// timeout.
func TestNewSinkRefusesUndefaultedConfig(t *testing.T) {
	tests := []struct {
		name    string
		tune    func(*config.WebhookSink)
		wantErr string
	}{
		{name: "no timeout", tune: func(w *config.WebhookSink) { w.Timeout.Duration = 0 }, wantErr: "timeout"},
		{name: "no spool directory", tune: func(w *config.WebhookSink) { w.Spool.Directory = "" }, wantErr: "spool.directory"},
		{name: "no spool bound", tune: func(w *config.WebhookSink) { w.Spool.MaxBytes = 0 }, wantErr: "spool.maxBytes"},
		{name: "no secret key", tune: func(w *config.WebhookSink) {
			w.SecretsFile, w.SecretRef = "", &config.SecretKeyRef{Namespace: "hubsync", Name: "hook"}
		}, wantErr: "secretRef.key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "https://hook.example")
			hook := *e.cfg.Webhook
			tt.tune(&hook)
			e.cfg.Webhook = &hook
			s, err := newSink(e.cfg, e.deps, e.opts)
			if err == nil {
				_ = s.Close()
				t.Fatalf("newSink() accepted a section without %s", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("newSink() = %v; want an error naming %s", err, tt.wantErr)
			}
		})
	}
}
