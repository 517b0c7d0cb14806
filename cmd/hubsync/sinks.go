package main

import (
	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/sinks"
)

// sinkFactories are the sink types this binary can run.
var sinkFactories = map[string]sinks.Factory{}

var _ = config.SinkTypes
