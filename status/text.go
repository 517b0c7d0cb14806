package status

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// MaxTextTunnels bounds the failing tunnels the text names, of the
// MaxFailingTunnels a status holds.
const MaxTextTunnels = 10

// MaxTextNamespaces bounds the consumer namespaces the text lists, those
// with stale copies and the oldest copies first; JSON lists every one.
const MaxTextNamespaces = 20

// WriteJSON writes st as indented JSON.
func WriteJSON(w io.Writer, st Status) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(st)
}

// WriteText writes st in a few lines for people.
func WriteText(w io.Writer, st Status) error {
	p := &printer{w: w}
	ready := "ready"
	if !st.Ready {
		ready = "not ready"
	}
	p.printf("hubsync at %s: %s (%s)\n", st.Address, ready, st.Reason)
	p.leader(st.Leader)
	if st.Hub != nil {
		p.printf("hub:       %s\n", map[bool]string{true: "reachable", false: "NOT reachable (hubsync_hub_reachable 0)"}[st.Hub.Reachable])
	}
	p.config(st.Config, st.At)
	switch {
	case st.Leader.Leading && !st.Ready && (st.Consumers == nil || len(st.Consumers.Namespaces) == 0):
		p.printf("consumers: not known yet: the syncer reports them once its caches have synced\n")
		p.sinks(st.Sinks, st.At)
	case st.Leader.Leading:
		p.consumers(st.Consumers, st.At)
		p.sinks(st.Sinks, st.At)
	default:
		p.printf("consumers: only the leader runs the syncer and the sinks; run hubsync status against %s\n", leaderPod(st.Leader))
	}
	p.bus(st.Bus)
	p.tunnels(st.Tunnels, st.At)
	p.gateway(st.Gateway)
	return p.err
}

func (p *printer) bus(b *Bus) {
	if b == nil {
		return
	}
	line := "bus:       "
	if r := b.StreamReplicas; r != nil {
		line += fmt.Sprintf("event stream replicas %d current, %d behind, %d offline", r.Current, r.Behind, r.Offline)
	} else {
		line += "event stream not made yet"
	}
	var copies []string
	for _, c := range b.Copies {
		s := fmt.Sprintf("%s lag %d/%d", c.Consumer, c.EventsLag, c.RecordsLag)
		if c.Failing {
			s += " FAILING"
		}
		copies = append(copies, s)
	}
	if len(copies) > 0 {
		line += "; copies (events/records behind): " + strings.Join(copies, ", ")
	}
	p.printf("%s\n", line)
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) table(rows [][]string) {
	if p.err != nil {
		return
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+strings.Join(r, "\t"))
	}
	p.err = tw.Flush()
}

func (p *printer) leader(l Leader) {
	switch {
	case l.Leading:
		p.printf("leader:    this replica leads (%s)\n", orUnknown(l.Identity))
	case l.Identity == "":
		p.printf("leader:    this replica stands by; it has not seen a leader yet\n")
	default:
		p.printf("leader:    another replica leads: %s (pod %s); this replica stands by\n", l.Identity, podOf(l.Identity))
	}
}

func leaderPod(l Leader) string {
	if l.Identity == "" {
		return "the leader's pod"
	}
	return "pod " + podOf(l.Identity)
}

func (p *printer) config(c *Config, now time.Time) {
	if c == nil {
		return
	}
	switch {
	case c.Reloads == 0:
		p.printf("config:    loaded %s; not reloaded since", ago(now, c.LastSuccess))
	case c.LastReloadSuccessful:
		p.printf("config:    last reload applied; last good load %s; %d reloads, %d rejected", ago(now, c.LastSuccess), c.Reloads, c.RejectedReloads)
	default:
		p.printf("config:    last reload REJECTED (the running configuration stays; see the log); last good load %s; %d reloads, %d rejected",
			ago(now, c.LastSuccess), c.Reloads, c.RejectedReloads)
	}
	if c.RestartRequired {
		p.printf("; RESTART REQUIRED for changes in the file")
	}
	p.printf("\n")
}

func (p *printer) consumers(c *Consumers, now time.Time) {
	if c == nil || len(c.Namespaces) == 0 {
		p.printf("consumers: none (no profile of hubsync's in any namespace)\n")
		return
	}
	p.printf("consumers: %s, %s, %s (%d stale)", count(len(c.Namespaces), "namespace"), count(c.Profiles, "profile"),
		count(c.Copies, "credential copy"), c.StaleCopies)
	if c.OldestCopySyncedAt != nil {
		p.printf(", oldest copy synced %s", ago(now, c.OldestCopySyncedAt))
	}
	p.printf("\n")
	list := slices.Clone(c.Namespaces)
	slices.SortStableFunc(list, func(a, b Namespace) int {
		return cmp.Or(cmp.Compare(b.StaleCopies, a.StaleCopies), cmp.Compare(age(b.OldestCopyAgeSeconds), age(a.OldestCopyAgeSeconds)))
	})
	rows := [][]string{{"NAMESPACE", "PROFILES", "COPIES", "STALE", "OLDEST COPY"}}
	for i, n := range list {
		if i == MaxTextNamespaces {
			break
		}
		oldest := "-"
		if n.OldestCopyAgeSeconds != nil {
			oldest = seconds(*n.OldestCopyAgeSeconds)
		}
		rows = append(rows, []string{n.Name, fmt.Sprint(n.Profiles), fmt.Sprint(n.Copies), fmt.Sprint(n.StaleCopies), oldest})
	}
	p.table(rows)
	if more := len(list) - MaxTextNamespaces; more > 0 {
		p.printf("  and %d more namespaces (-o json lists every one)\n", more)
	}
}

func (p *printer) sinks(sinks []Sink, now time.Time) {
	if len(sinks) == 0 {
		p.printf("sinks:     none\n")
		return
	}
	down := 0
	for _, s := range sinks {
		if !s.Up {
			down++
		}
	}
	p.printf("sinks:     %d up, %d down\n", len(sinks)-down, down)
	rows := [][]string{{"NAME", "TYPE", "STATE", "QUEUED", "OLDEST WAITING", "LAST SUCCESS", "ERROR"}}
	for _, s := range sinks {
		state := "up"
		if !s.Up {
			state = "DOWN"
		}
		oldest := "-"
		if s.OldestWaitingAgeSeconds != nil {
			oldest = seconds(*s.OldestWaitingAgeSeconds)
		}
		rows = append(rows, []string{s.Name, s.Type, state, fmt.Sprint(s.Queued), oldest, ago(now, s.LastSuccess), orDash(s.Error)})
	}
	p.table(rows)
}

func (p *printer) tunnels(t *Tunnels, now time.Time) {
	if t == nil {
		return
	}
	p.printf("tunnels:   %d ready, %d failing, %d connecting\n", t.Ready, t.Failing, t.Connecting)
	for i, f := range t.FailingTunnels {
		if i == MaxTextTunnels {
			break
		}
		p.printf("  failing: %s", f.Cluster)
		if f.Since != nil {
			p.printf(" since %s", ago(now, f.Since))
		}
		if f.Reason != "" {
			p.printf(": %s", f.Reason)
		}
		p.printf("\n")
	}
	if more := t.Failing - min(len(t.FailingTunnels), MaxTextTunnels); more > 0 {
		p.printf("  and %d more failing (-o json names %d; the hubsync_tunnel_state metric every one)\n", more, MaxFailingTunnels)
	}
}

var classes = []string{"2xx", "3xx", "4xx", "5xx", "other"}

func (p *printer) gateway(g *Gateway) {
	if g == nil {
		return
	}
	total, byClass := splitByClass(g.Requests, num)
	p.printf("gateway:   %s requests%s, %s refused, %s TokenReview errors, %s upgraded connections open\n",
		num(total), byClass, num(g.Refused), num(g.TokenReviewErrors), num(g.UpgradedConnections))
	if r := g.Rates; r != nil {
		total, byClass := splitByClass(r.Requests, func(n float64) string { return rate(n) + "/s" })
		p.printf("           over %s: %s requests/s%s, %s refused/s, %s TokenReview errors/s\n",
			seconds(r.IntervalSeconds), rate(total), byClass, rate(r.Refused), rate(r.TokenReviewErrors))
	}
}

// ago is "3m4s ago", or "never".
func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return seconds(max(now.Sub(*t).Seconds(), 0)) + " ago"
}

// seconds is a duration in seconds as "1h2m3s" (whole seconds, or
// milliseconds below one second).
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func age(s *float64) float64 {
	if s == nil {
		return -1
	}
	return *s
}

func num(f float64) string { return fmt.Sprintf("%.0f", f) }

func rate(f float64) string {
	if f != 0 && f < 10 {
		return fmt.Sprintf("%.2f", f)
	}
	return fmt.Sprintf("%.0f", f)
}

// count is "1 profile", "2 profiles", "2 credential copies".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "identity not known yet"
	}
	return s
}

// splitByClass sums requests by status class and lists them in class
// order, as " (2xx N, 4xx N)" ("" when there are none).
func splitByClass(requests map[string]float64, format func(float64) string) (total float64, byClass string) {
	var parts []string
	for _, c := range classes {
		if n, ok := requests[c]; ok {
			total += n
			parts = append(parts, c+" "+format(n))
		}
	}
	if len(parts) > 0 {
		byClass = " (" + strings.Join(parts, ", ") + ")"
	}
	return total, byClass
}
