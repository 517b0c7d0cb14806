package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// uid is the dashboard's stable identity, so that an import replaces the
// previous version instead of adding a copy.
const uid = "hubsync-overview"

// description is shown under the dashboard's title; docs/dashboard.md
// says the same at more length.
const description = "hubsync: convergence of profiles and credential copies, events on the bus, " +
	"each sink's delivery and backlog, the tunnel pool and the access gateway. " +
	"Gateway latency is the fleet's, by mode, and each cluster set's (ManagedClusterSet): " +
	"hubsync_gateway_request_duration_seconds has a cluster_set label but no cluster label, " +
	"so that a fleet of thousands of clusters does not cost thousands of histograms. " +
	"Request rates and codes are broken down per cluster set, and per cluster (the busiest ten, and the ten with most 5xx answers). " +
	"See docs/dashboard.md."

// sel selects the series of the replicas chosen in the dashboard's
// variables.
const sel = `job=~"$job", namespace=~"$namespace", pod=~"$pod"`

// rate is the window of every rate() and increase().
const rate = "[$__rate_interval]"

// m writes a selector of name: the dashboard's variables, then matchers.
func m(name string, matchers ...string) string {
	return name + "{" + strings.Join(append([]string{sel}, matchers...), ", ") + "}"
}

// rateBy is sum by (labels) (rate(name{...}[$__rate_interval])).
func rateBy(labels, name string, matchers ...string) string {
	if labels == "" {
		return "sum(rate(" + m(name, matchers...) + rate + "))"
	}
	return "sum by (" + labels + ") (rate(" + m(name, matchers...) + rate + "))"
}

// quantile is the q quantile of a histogram, by labels besides le.
func quantile(q, labels, name string, matchers ...string) string {
	by := "le"
	if labels != "" {
		by = labels + ", le"
	}
	return fmt.Sprintf("histogram_quantile(%s, sum by (%s) (rate(%s%s)))", q, by, m(name+"_bucket", matchers...), rate)
}

// noSet names the series of clusters in no cluster set "(none)", so that
// a legend by cluster_set does not show them as nothing.
func noSet(expr string) string {
	return `label_replace(` + expr + `, "cluster_set", "(none)", "cluster_set", "")`
}

// query is one target of a panel.
type query struct {
	expr, legend string
}

func q(expr, legend string) query { return query{expr, legend} }

// medianAndP99 are the fleet's p50 and p99 of a histogram.
func medianAndP99(name string) []query {
	return []query{q(quantile("0.5", "", name), "p50"), q(quantile("0.99", "", name), "p99")}
}

// board builds the dashboard, numbering panels as they are added.
type board struct {
	b      *dashboard.DashboardBuilder
	nextID uint32
	ds     common.DataSourceRef
}

func (d *board) id() uint32 {
	d.nextID++
	return d.nextID
}

func (d *board) targets(qs []query) []cog.Builder[variants.Dataquery] {
	out := make([]cog.Builder[variants.Dataquery], 0, len(qs))
	for i, x := range qs {
		t := prometheus.NewDataqueryBuilder().Datasource(d.ds).Expr(x.expr).RefId(string(rune('A' + i))).Range()
		if x.legend != "" {
			t = t.LegendFormat(x.legend)
		}
		out = append(out, t)
	}
	return out
}

func (d *board) row(title string) {
	d.b.WithRow(dashboard.NewRowBuilder(title).Id(d.id()))
}

// graph adds a time series panel, w columns wide (of 24).
func (d *board) graph(w uint32, title, unit, desc string, qs ...query) {
	d.b.WithPanel(timeseries.NewPanelBuilder().
		Id(d.id()).Title(title).Description(desc).Datasource(d.ds).
		Unit(unit).Min(0).Span(w).Height(8).
		FillOpacity(10).LineWidth(1).ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Targets(d.targets(qs)))
}

// states maps a 0/1 gauge to words and colours.
func states(zero, zeroColor, one, oneColor string) []dashboard.ValueMapping {
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{
		Type: dashboard.MappingTypeValueToText,
		Options: map[string]dashboard.ValueMappingResult{
			"0": {Text: cog.ToPtr(zero), Color: cog.ToPtr(zeroColor), Index: cog.ToPtr[int32](0)},
			"1": {Text: cog.ToPtr(one), Color: cog.ToPtr(oneColor), Index: cog.ToPtr[int32](1)},
		},
	}}}
}

// thresholds colours a count: green at 0, color from 1.
func thresholds(color string) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
		{Value: nil, Color: "green"}, {Value: cog.ToPtr(1.0), Color: color},
	})
}

// single adds a stat panel showing the last value of each series.
func (d *board) single(w, h uint32, title, desc string, text common.BigValueTextMode, mappings []dashboard.ValueMapping,
	th *dashboard.ThresholdsConfigBuilder, qs ...query) {
	p := stat.NewPanelBuilder().
		Id(d.id()).Title(title).Description(desc).Datasource(d.ds).Span(w).Height(h).
		TextMode(text).ColorMode(common.BigValueColorModeBackground).GraphMode(common.BigValueGraphModeNone).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		NoValue("none").
		Targets(d.targets(qs))
	if mappings != nil {
		p = p.Mappings(mappings)
	}
	if th != nil {
		p = p.Thresholds(th)
	}
	d.b.WithPanel(p)
}

// list adds a table of one instant query's series, by their labels.
func (d *board) list(w uint32, title, unit, desc string, x query) {
	t := prometheus.NewDataqueryBuilder().Datasource(d.ds).Expr(x.expr).RefId("A").Instant().Format(prometheus.PromQueryFormatTable)
	d.b.WithPanel(table.NewPanelBuilder().
		Id(d.id()).Title(title).Description(desc).Datasource(d.ds).Unit(unit).Span(w).Height(8).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]any{"Time": true},
			"renameByName":  map[string]any{"Value": "time in state"},
		}}).
		SortBy([]cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName("time in state").Desc(true)}).
		WithTarget(t))
}

// variables are the data source and the replicas to show.
func variables() []cog.Builder[dashboard.VariableModel] {
	label := func(name, title, query string, multi bool) cog.Builder[dashboard.VariableModel] {
		v := dashboard.NewQueryVariableBuilder(name).Label(title).
			Datasource(common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}).
			Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).Definition(query).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
			IncludeAll(true).AllValue(".*").Multi(multi)
		return v
	}
	return []cog.Builder[dashboard.VariableModel]{
		dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus"),
		label("job", "Job", `label_values(hubsync_leader, job)`, false),
		label("namespace", "Namespace", `label_values(hubsync_leader{job=~"$job"}, namespace)`, false),
		label("pod", "Pod", `label_values(hubsync_leader{job=~"$job", namespace=~"$namespace"}, pod)`, true),
	}
}

// build returns the dashboard's JSON, indented, with a final newline.
func build() ([]byte, error) {
	d := &board{
		b: dashboard.NewDashboardBuilder("hubsync").Uid(uid).Description(description).
			Tags([]string{"hubsync", "open-cluster-management"}).
			Editable().Tooltip(dashboard.DashboardCursorSyncCrosshair).
			Time("now-3h", "now").Refresh("30s").Timezone("browser").
			Variables(variables()),
		ds: common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")},
	}
	header(d)
	convergence(d)
	bus(d)
	sinks(d)
	tunnels(d)
	gateway(d)
	dash, err := d.b.Build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(dash, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func header(d *board) {
	d.row("Overview")
	d.single(3, 4, "Leader", "1 on the replica that holds the leader Lease and writes; the others stand by.",
		common.BigValueTextModeValueAndName, states("standby", "blue", "leader", "green"), nil,
		q("max by (pod) ("+m("hubsync_leader")+")", "{{pod}}"))
	d.single(3, 4, "Lease holder", "The identity holding the leader Lease, as each replica sees it. More than one name means the replicas disagree.",
		common.BigValueTextModeName, nil, nil,
		q("max by (identity) ("+m("hubsync_leader_info")+")", "{{identity}}"))
	d.single(3, 4, "Hub reachable", "0 when a replica's last probe of the hub API server's /readyz failed.",
		common.BigValueTextModeValue, states("unreachable", "red", "reachable", "green"), nil,
		q("min("+m("hubsync_hub_reachable")+")", ""))
	d.single(3, 4, "Last config reload", "Whether the last reload of the configuration file was applied; a rejected file leaves the running configuration in place.",
		common.BigValueTextModeValue, states("rejected", "red", "applied", "green"), nil,
		q("min("+m("hubsync_config_last_reload_successful")+")", ""))
	d.single(3, 4, "Restart required", "1 while the configuration file holds changes that take effect only after a restart.",
		common.BigValueTextModeValue, states("no", "green", "yes", "orange"), nil,
		q("max("+m("hubsync_config_restart_required")+")", ""))
	d.single(3, 4, "Managed profiles", "ClusterProfiles carrying hubsync's cluster-manager label.",
		common.BigValueTextModeValue, nil, dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).
			Steps([]dashboard.Threshold{{Value: nil, Color: "blue"}}),
		q("max("+m("hubsync_profiles_managed")+")", ""))
	d.single(3, 4, "Sinks failing", "Sinks whose hubsync_sink_up is 0 on some replica.",
		common.BigValueTextModeValue, nil, thresholds("red"),
		q("count(min by (sink) ("+m("hubsync_sink_up")+") == 0) or vector(0)", ""))
	d.single(3, 4, "Tunnels failing", "Tunnel pool entries failing, summed over the replicas (each keeps its own pool).",
		common.BigValueTextModeValue, nil, thresholds("orange"),
		q("sum("+m("hubsync_tunnel_entries", `state="failing"`)+") or vector(0)", ""))
}

func convergence(d *board) {
	d.row("Convergence and writes")
	d.graph(8, "Reconciles", "ops", "Reconciliations per second by controller (topology, credentials) and result.",
		q(rateBy("controller, result", "hubsync_reconcile_total"), "{{controller}} {{result}}"))
	d.graph(8, "Reconcile duration", "s", "Time one reconciliation of a key took, writes included.",
		q(quantile("0.5", "controller", "hubsync_reconcile_duration_seconds"), "p50 {{controller}}"),
		q(quantile("0.99", "controller", "hubsync_reconcile_duration_seconds"), "p99 {{controller}}"))
	d.graph(8, "Work queue depth", "short", "Keys waiting in the topology and credentials work queues.",
		q("max by (queue) ("+m("hubsync_queue_depth")+")", "{{queue}}"))
	d.graph(8, "Profile writes", "ops", "ClusterProfile writes per second by operation, and those the hub refused.",
		q(rateBy("op", "hubsync_profile_writes_total"), "{{op}}"),
		q(rateBy("op", "hubsync_profile_write_errors_total", `op!~"credential-.*"`), "refused {{op}}"))
	d.graph(8, "Credential copy writes", "ops", "Credential copy writes per second by operation, those the hub refused, and token rotations propagated.",
		q(rateBy("op", "hubsync_credential_writes_total"), "{{op}}"),
		q(rateBy("op", "hubsync_profile_write_errors_total", `op=~"credential-.*"`), "refused {{op}}"),
		q(rateBy("", "hubsync_credential_rotations_total"), "rotations"))
	d.graph(8, "Held back", "short", "What hubsync does not write: credential pairs it cannot copy (by reason), profiles blocked by another cluster manager's, "+
		"cluster sets whose selector cannot be evaluated, and objects another controller keeps writing.",
		q("max by (reason) ("+m("hubsync_credential_problems")+")", "copy problem {{reason}}"),
		q("max("+m("hubsync_profile_conflicts")+")", "profile conflicts"),
		q("max("+m("hubsync_invalid_cluster_sets")+")", "invalid cluster sets"),
		q("max by (kind) ("+m("hubsync_contested_objects")+")", "contested {{kind}}"))
	d.graph(8, "Profiles by consumer namespace", "short", "ClusterProfiles hubsync manages in each consumer namespace (the ten largest).",
		q("topk(10, max by (consumer_namespace) ("+m("hubsync_consumer_profiles")+"))", "{{consumer_namespace}}"))
	d.graph(8, "Credential copies by consumer namespace", "short", "Credential copies in each consumer namespace, and those not in step with their source's current token.",
		q("topk(10, max by (consumer_namespace) ("+m("hubsync_consumer_credential_copies")+"))", "{{consumer_namespace}}"),
		q("max by (consumer_namespace) ("+m("hubsync_consumer_credential_copies_stale")+") > 0", "stale {{consumer_namespace}}"))
	d.graph(8, "Oldest credential copy", "s", "Per consumer namespace, how long ago its oldest copy was last brought in step with its source (the ten oldest).",
		q("topk(10, time() - min by (consumer_namespace) ("+m("hubsync_consumer_credential_copy_oldest_timestamp_seconds")+" > 0))", "{{consumer_namespace}}"))
}

func bus(d *board) {
	d.row("Events and bus")
	d.graph(8, "Events published", "ops", "Events JetStream acknowledged, by CloudEvents type, and those it found duplicates of one already stored.",
		q(rateBy("type", "hubsync_bus_events_published_total"), "{{type}}"),
		q(rateBy("", "hubsync_bus_events_duplicates_total"), "duplicates"))
	d.graph(8, "Bus errors and resyncs", "ops", "Failed publish attempts and KV writes (each retried), and republishes of the whole state.",
		q(rateBy("", "hubsync_bus_publish_errors_total"), "publish errors"),
		q(rateBy("", "hubsync_bus_kv_write_errors_total"), "KV write errors"),
		q(rateBy("", "hubsync_bus_resyncs_total"), "resyncs"))
	d.graph(8, "Bus connected", "short", "1 while a replica is connected to NATS.",
		q("max by (pod) ("+m("hubsync_bus_connected")+")", "{{pod}}"))
	d.graph(12, "Publish duration", "s", "Time from sending an event to JetStream's acknowledgement, per attempt.",
		medianAndP99("hubsync_bus_publish_duration_seconds")...)
	d.graph(12, "Bus lag", "s", "Time from a change being made to its event being on the bus (the nats sink's delivery lag).",
		q(quantile("0.5", "", "hubsync_sink_delivery_lag_duration_seconds", `sink="nats"`), "p50"),
		q(quantile("0.99", "", "hubsync_sink_delivery_lag_duration_seconds", `sink="nats"`), "p99"))
}

func sinks(d *board) {
	d.row("Sinks")
	d.graph(8, "Delivered", "ops", "Changes delivered per second, by sink (nats is the bus).",
		q(rateBy("sink", "hubsync_sink_delivered_total"), "{{sink}}"))
	d.graph(8, "Failures, drops and resyncs", "ops", "Failed delivery attempts (retried with backoff), changes dropped because a sink's queue was full, and resyncs from a snapshot, by sink.",
		q(rateBy("sink", "hubsync_sink_delivery_failures_total"), "failures {{sink}}"),
		q(rateBy("sink", "hubsync_sink_dropped_total"), "dropped {{sink}}"),
		q(rateBy("sink", "hubsync_sink_resyncs_total"), "resyncs {{sink}}"))
	d.single(8, 8, "Sink health", "0 while a sink is failing: its last hand-over failed, or its target has refused or been out of reach past its failingAfter.",
		common.BigValueTextModeValueAndName, states("failing", "red", "ok", "green"), nil,
		q("min by (sink) ("+m("hubsync_sink_up")+")", "{{sink}}"))
	d.graph(8, "Backlog", "short", "Changes waiting for each sink: in its queue and, for a webhook, in its spool.",
		q("max by (sink) ("+m("hubsync_sink_queue_depth")+")", "{{sink}}"))
	d.graph(8, "Oldest waiting change", "s", "Age of the oldest change waiting for each sink; nothing while none waits.",
		q("max by (sink) (time() - ("+m("hubsync_sink_oldest_waiting_timestamp_seconds")+" > 0))", "{{sink}}"))
	d.graph(8, "Delivery lag", "s", "99th percentile of the time from a change being made to its delivery, by sink.",
		q(quantile("0.99", "sink", "hubsync_sink_delivery_lag_duration_seconds"), "{{sink}}"))
	d.graph(8, "Since last success", "s", "Time since each sink's last successful delivery or resync (for a webhook, the last 2xx).",
		q("time() - max by (sink) ("+m("hubsync_sink_last_success_timestamp_seconds")+" > 0)", "{{sink}}"))
	d.graph(8, "Webhook answers", "reqps", "Requests webhook sinks made, by sink and HTTP status code (error: no response).",
		q(rateBy("sink, code", "hubsync_webhook_requests_total"), "{{sink}} {{code}}"))
	d.graph(8, "Webhook spool", "short", "Events waiting in each webhook sink's on-disk spool, and events not spooled because it was full.",
		q("max by (sink) ("+m("hubsync_webhook_spool_events")+")", "{{sink}}"),
		q(rateBy("sink", "hubsync_webhook_spool_dropped_total"), "dropped/s {{sink}}"))
}

func tunnels(d *board) {
	d.row("Tunnel pool")
	d.graph(8, "Entries by state", "short", "Tunnel pool entries by state on each replica (every replica keeps its own pool).",
		q("sum by (pod, state) ("+m("hubsync_tunnel_entries")+")", "{{state}} {{pod}}"))
	d.graph(8, "Dials", "ops", "Connections dialed per second (tunnel, TLS and HTTP/2), and those of their own for upgraded requests, by result.",
		q(rateBy("result", "hubsync_tunnel_dials_total"), "{{result}}"),
		q(rateBy("result", "hubsync_tunnel_upgrade_dials_total"), "upgrade {{result}}"))
	d.graph(8, "Probes and state changes", "ops", "Health probes of entries by result, and entries entering each state.",
		q(rateBy("result", "hubsync_tunnel_probes_total"), "probe {{result}}"),
		q(rateBy("state", "hubsync_tunnel_transitions_total"), "to {{state}}"))
	d.graph(8, "Dial duration", "s", "Time to dial a pool entry: tunnel, TLS and HTTP/2 handshakes.",
		medianAndP99("hubsync_tunnel_dial_duration_seconds")...)
	d.graph(8, "Probe round trip", "s", "Round trip of successful probes of pool entries.",
		medianAndP99("hubsync_tunnel_probe_duration_seconds")...)
	d.list(8, "Failing tunnels", "s", "The clusters whose entry is failing, longest first (at most 20), and for how long.",
		q("topk(20, max by (cluster, pod) ((time() - "+m("hubsync_tunnel_state_since_timestamp_seconds")+") and on (cluster, pod) ("+
			m("hubsync_tunnel_state", `state="failing"`)+" == 1)))", ""))
}

func gateway(d *board) {
	d.row("Access gateway")
	d.graph(8, "Requests", "reqps", "Gateway requests per second by HTTP code and mode (impersonate, passthrough, refused).",
		q(rateBy("code, mode", "hubsync_gateway_requests_total"), "{{code}} {{mode}}"))
	d.graph(8, "Refused", "reqps", "Requests the gateway answered itself instead of a cluster, by reason.",
		q(rateBy("reason", "hubsync_gateway_refused_total"), "{{reason}}"))
	d.graph(8, "Latency (fleet)", "s", "Time to serve gateway requests by mode, watches, follows and upgraded connections excluded. "+
		"The whole fleet's: the histogram has no cluster label (see Latency by cluster set).",
		q(quantile("0.5", "mode", "hubsync_gateway_request_duration_seconds"), "p50 {{mode}}"),
		q(quantile("0.9", "mode", "hubsync_gateway_request_duration_seconds"), "p90 {{mode}}"),
		q(quantile("0.99", "mode", "hubsync_gateway_request_duration_seconds"), "p99 {{mode}}"))
	d.graph(8, "Requests by cluster set", "reqps", "Gateway requests per second to the clusters of each cluster set "+
		"(ManagedClusterSet, the cluster's cluster.open-cluster-management.io/clusterset label), and their 5xx answers. "+
		"(none): clusters in no set. Requests refused before their cluster is known to be served are left out (see Refused).",
		q(noSet(rateBy("cluster_set", "hubsync_gateway_requests_total", `cluster!=""`)), "{{cluster_set}}"),
		q(noSet(rateBy("cluster_set", "hubsync_gateway_requests_total", `cluster!=""`, `code=~"5.."`)), "5xx {{cluster_set}}"))
	d.graph(8, "Latency by cluster set", "s", "Time to serve gateway requests to the clusters of each cluster set, all modes together, "+
		"watches, follows and upgraded connections excluded. (none): clusters in no set, and requests for a cluster not served. "+
		"Requests the gateway refused without an identity (mode refused) are left out.",
		q(noSet(quantile("0.5", "cluster_set", "hubsync_gateway_request_duration_seconds", `mode!="refused"`)), "p50 {{cluster_set}}"),
		q(noSet(quantile("0.99", "cluster_set", "hubsync_gateway_request_duration_seconds", `mode!="refused"`)), "p99 {{cluster_set}}"))
	d.graph(8, "Busiest clusters", "reqps", "The ten clusters with most gateway requests per second.",
		q("topk(10, "+rateBy("cluster", "hubsync_gateway_requests_total", `cluster!=""`)+")", "{{cluster}}"))
	d.graph(8, "Clusters answering 5xx", "reqps", "The ten clusters with most 5xx answers per second through the gateway.",
		q("topk(10, "+rateBy("cluster", "hubsync_gateway_requests_total", `cluster!=""`, `code=~"5.."`)+")", "{{cluster}}"))
	d.graph(8, "TokenReviews", "ops", "Bearer tokens checked with the hub's TokenReview by result, and tokens found in the review cache instead.",
		q(rateBy("result", "hubsync_gateway_token_reviews_total"), "{{result}}"),
		q(rateBy("", "hubsync_gateway_token_review_cache_hits_total"), "cache hits"))
	d.graph(8, "TokenReview duration", "s", "Time the hub took to answer the gateway's TokenReviews.",
		medianAndP99("hubsync_gateway_token_review_duration_seconds")...)
	d.graph(8, "Tunnel wait", "s", "How long requests waited for a cluster's tunnel that was still connecting (bounded by gateway.tunnelWait).",
		medianAndP99("hubsync_gateway_tunnel_wait_duration_seconds")...)
	d.graph(8, "Upgraded connections", "short", "Exec, attach and port-forward connections open through each replica's gateway.",
		q("sum by (pod) ("+m("hubsync_gateway_upgraded_connections")+")", "{{pod}}"))
}
