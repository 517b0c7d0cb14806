package daemon

import (
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/argocd"
	"github.com/hubsync/hubsync/sinks/kubeconfig"
	"github.com/hubsync/hubsync/sinks/kueue"
	"github.com/hubsync/hubsync/sinks/webhook"
)

// Sinks returns every built-in sink type, by configuration type: an
// explicit map rather than registration in init functions, so that what a
// daemon can run is visible here.
func Sinks() map[string]sinks.Factory {
	return map[string]sinks.Factory{
		config.SinkKubeconfig: kubeconfig.New,
		config.SinkArgoCD:     argocd.New,
		config.SinkWebhook:    webhook.New,
		config.SinkKueue:      kueue.New,
	}
}
