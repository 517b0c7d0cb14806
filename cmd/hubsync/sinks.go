package main

import (
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
	"github.com/hubsync/hubsync/sinks/argocd"
	"github.com/hubsync/hubsync/sinks/kubeconfig"
	"github.com/hubsync/hubsync/sinks/webhook"
)

// sinkFactories returns the sink types this binary can run, by config type.
func sinkFactories() map[string]sinks.Factory {
	return map[string]sinks.Factory{
		config.SinkKubeconfig: kubeconfig.New,
		config.SinkArgoCD:     argocd.New,
		config.SinkWebhook:    webhook.New,
	}
}
