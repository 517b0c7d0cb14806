{{/*
Labels of every object: what deploy/ has always carried, plus Helm's own
with chartLabels.
*/}}
{{- define "hubsync.labels" -}}
app.kubernetes.io/name: hubsync
{{- if .Values.chartLabels }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- end }}

{{/* The controller's labels: the pods, and what belongs to them. */}}
{{- define "hubsync.controllerLabels" -}}
{{ include "hubsync.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/* The gateway's objects. */}}
{{- define "hubsync.gatewayLabels" -}}
{{ include "hubsync.labels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/*
The pods' selector. It leaves out the release's labels so that it stays
what deploy/ has (a Deployment's selector cannot change).
*/}}
{{- define "hubsync.selectorLabels" -}}
app.kubernetes.io/name: hubsync
app.kubernetes.io/component: controller
{{- end }}

{{/* The ServiceAccount hubsync runs as. */}}
{{- define "hubsync.subject" -}}
- kind: ServiceAccount
  name: hubsync
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
hubsync's configuration as the ConfigMap holds it: .Values.config with the
release's namespace filled into the fields values.yaml leaves empty for it.
Everything else is as given. Templates read it with
  $config := include "hubsync.config" . | fromYaml
*/}}
{{- define "hubsync.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $ns := .Release.Namespace -}}
{{- $le := get $config "leaderElection" | default dict -}}
{{- if not (get $le "namespace") }}{{ $_ := set $le "namespace" $ns }}{{ end -}}
{{- $_ := set $config "leaderElection" $le -}}
{{- $gw := get $config "gateway" | default dict -}}
{{- $tls := get $gw "tls" | default dict -}}
{{- $secret := get $tls "secret" -}}
{{- if and $secret (not (get $secret "namespace")) }}{{ $_ := set $secret "namespace" $ns }}{{ end -}}
{{- if not (get $gw "url") -}}
{{- $_ := set $gw "url" (printf "https://hubsync-gateway.%s.svc:%s" $ns (include "hubsync.port" (get $gw "listen" | default ":8443"))) -}}
{{- end -}}
{{- $_ := set $config "gateway" $gw -}}
{{- $bus := get $config "bus" | default dict -}}
{{- if include "hubsync.busEmbedded" . -}}
{{- $emb := get $bus "embedded" | default dict -}}
{{- $dir := "/etc/hubsync/bus-tls" -}}
{{- if .Values.bus.expose -}}
{{- /* Consumers in other pods reach the node through the Service
       hubsync-nats, over TLS, each signing in with its own NKey. */ -}}
{{- $_ := set $emb "listen" (printf "0.0.0.0:%s" (include "hubsync.port" (get $emb "listen" | default "127.0.0.1:4222"))) -}}
{{- $tls := get $emb "tls" | default dict -}}
{{- if not (get $tls "certFile") -}}
{{- $_ := set $tls "certFile" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $tls "keyFile" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- $_ := set $emb "tls" $tls -}}
{{- end -}}
{{- $cluster := get $emb "cluster" | default dict -}}
{{- if and (gt (int .Values.replicas) 1) (not (get $cluster "name")) -}}
{{- /* The replicas' nodes form one JetStream cluster over the headless
       Service hubsync-bus; each node is named after its pod. */ -}}
{{- $routes := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $routes = append $routes (printf "nats://hubsync-%d.hubsync-bus.%s.svc:%d" $i $ns (int $.Values.bus.routePort)) -}}
{{- end -}}
{{- $_ := set $cluster "name" "hubsync" -}}
{{- $_ := set $cluster "listen" (printf "0.0.0.0:%d" (int .Values.bus.routePort)) -}}
{{- $_ := set $cluster "routes" $routes -}}
{{- $_ := set $cluster "tls" (dict "certFile" (printf "%s/tls.crt" $dir) "keyFile" (printf "%s/tls.key" $dir) "caFile" (printf "%s/ca.crt" $dir)) -}}
{{- $_ := set $emb "cluster" $cluster -}}
{{- $st := get $bus "stream" | default dict -}}
{{- if le (int (get $st "replicas" | default 1)) 1 -}}
{{- $_ := set $st "replicas" (min 3 (int .Values.replicas)) -}}
{{- end -}}
{{- $_ := set $bus "stream" $st -}}
{{- end -}}
{{- $_ := set $bus "embedded" $emb -}}
{{- $_ := set $config "bus" $bus -}}
{{- end -}}
{{- toYaml $config -}}
{{- end }}

{{/*
"true" when hubsync runs the bus itself: its replicas' embedded NATS
nodes (bus enabled, no bus.urls). Empty otherwise.
*/}}
{{- define "hubsync.busEmbedded" -}}
{{- $bus := .Values.config.bus | default dict -}}
{{- if and (get $bus "enabled" | default false) (not (get $bus "urls")) }}true{{ end -}}
{{- end }}

{{/*
"true" when the embedded bus uses the TLS Secret: it listens off
loopback (bus.expose) or its nodes form a cluster.
*/}}
{{- define "hubsync.busTLS" -}}
{{- if and (include "hubsync.busEmbedded" .) (or .Values.bus.expose (gt (int .Values.replicas) 1)) }}true{{ end -}}
{{- end }}

{{/* "true" when the chart makes the bus's TLS Secret itself. */}}
{{- define "hubsync.busTLSGenerated" -}}
{{- if and (include "hubsync.busTLS" .) .Values.bus.tls.generate }}true{{ end -}}
{{- end }}

{{/* The port of a host:port address. */}}
{{- define "hubsync.port" -}}
{{- $port := regexFind "[0-9]+$" . -}}
{{- if not $port }}{{ fail (printf "%q has no port" .) }}{{ end -}}
{{- $port -}}
{{- end }}

{{/* The image: repository:tag, and @digest when one is set. */}}
{{- define "hubsync.image" -}}
{{- $tag := .Values.image.tag | default (printf "v%s" .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}
