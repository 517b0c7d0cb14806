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
{{- toYaml $config -}}
{{- end }}

{{/* The port of a host:port address. */}}
{{- define "hubsync.port" -}}
{{- $port := regexFind "[0-9]+$" . -}}
{{- if not $port }}{{ fail (printf "%q has no port" .) }}{{ end -}}
{{- $port -}}
{{- end }}
