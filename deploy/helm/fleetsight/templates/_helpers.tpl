{{/* Names: <release>-fleetsight-<component>, shortened to Kubernetes' 63 characters. */}}
{{- define "fleetsight.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetsight.name" -}}
{{- printf "%s-%s" (include "fleetsight.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleetsight.selectorLabels" -}}
app.kubernetes.io/name: fleetsight
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetsight.labels" -}}
{{ include "fleetsight.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Labels of chart-wide objects (rules, dashboards). */}}
{{- define "fleetsight.commonLabels" -}}
app.kubernetes.io/name: fleetsight
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleetsight.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The image runs as the unprivileged user fleetsight (10001); nothing needs to write but state. */}}
{{- define "fleetsight.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "fleetsight.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* prometheus.io/* annotations for Prometheus's kubernetes_sd_configs, when the operator is not used. */}}
{{- define "fleetsight.scrapeAnnotations" -}}
{{- if .root.Values.monitoring.annotations.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- if and .secured .root.Values.metricsAuth.enabled }}
prometheus.io/scheme: https
{{- end }}
fleetsight.io/job: {{ .job }}
{{- end }}
{{- end -}}

{{/* A readiness and a liveness probe on an HTTP path of the container's port named http. */}}
{{- define "fleetsight.probes" -}}
readinessProbe:
  httpGet: {path: {{ .ready }}, port: http}
  periodSeconds: 10
  timeoutSeconds: 5
livenessProbe:
  httpGet: {path: {{ .live | default .ready }}, port: http}
  initialDelaySeconds: 30
  periodSeconds: 30
  timeoutSeconds: 5
  failureThreshold: 4
{{- end -}}

{{/* A ServiceAccount; only the health service's mounts its token (the others call no Kubernetes API). */}}
{{- define "fleetsight.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "fleetsight.name" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "fleetsight.labels" . | nindent 4 }}
automountServiceAccountToken: {{ .automount | default false }}
{{- end -}}

{{- define "fleetsight.pdb" -}}
{{- if .values.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "fleetsight.name" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "fleetsight.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "fleetsight.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A Service on the container's port named http, labelled with the Prometheus job name. */}}
{{- define "fleetsight.service" -}}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "fleetsight.name" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "fleetsight.labels" . | nindent 4 }}
    fleetsight.io/job: {{ .job }}
spec:
  selector:
    {{- include "fleetsight.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ .values.port }}
      targetPort: http
{{- end -}}

{{/* A ServiceMonitor (prometheus-operator) whose job label is the local stack's job name. */}}
{{- define "fleetsight.serviceMonitor" -}}
{{- if .root.Values.monitoring.operator.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "fleetsight.name" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "fleetsight.labels" . | nindent 4 }}
    {{- with .root.Values.monitoring.operator.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  jobLabel: fleetsight.io/job
  selector:
    matchLabels:
      {{- include "fleetsight.selectorLabels" . | nindent 6 }}
  endpoints:
    - port: http
      path: /metrics
      interval: {{ .root.Values.monitoring.operator.interval }}
      {{- if .secured }}
      {{- include "fleetsight.metricsEndpointAuth" .root | nindent 6 }}
      {{- end }}
{{- end }}
{{- end -}}

{{/* The exporters' TLS and basic auth (values: metricsAuth): the Secret, where pods mount it, the
argument, the volume, and how Prometheus (PodMonitor/ServiceMonitor) scrapes with it. */}}
{{- define "fleetsight.metricsAuthSecret" -}}
{{- .Values.metricsAuth.existingSecret | default (printf "%s-metrics-auth" (include "fleetsight.fullname" .)) -}}
{{- end -}}

{{- define "fleetsight.metricsAuthDir" -}}
/etc/fleetsight/metrics-auth
{{- end -}}

{{- define "fleetsight.metricsAuthArgs" -}}
{{- if .Values.metricsAuth.enabled -}}
- --web.config.file={{ include "fleetsight.metricsAuthDir" . }}/web-config.yml
{{- end }}
{{- end -}}

{{- define "fleetsight.metricsAuthMount" -}}
{{- if .Values.metricsAuth.enabled -}}
- {name: metrics-auth, mountPath: {{ include "fleetsight.metricsAuthDir" . }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "fleetsight.metricsAuthVolume" -}}
{{- if .Values.metricsAuth.enabled -}}
- name: metrics-auth
  secret:
    secretName: {{ include "fleetsight.metricsAuthSecret" . }}
    defaultMode: 0440
    items:
      - {key: web-config.yml, path: web-config.yml}
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end -}}

{{/* Probes of an exporter: with basic auth on, every HTTP request needs the password, which must not go
into the pod spec; the probes then only check that the port accepts connections. */}}
{{- define "fleetsight.exporterProbes" -}}
{{- if .Values.metricsAuth.enabled -}}
readinessProbe:
  tcpSocket: {port: http}
  periodSeconds: 10
livenessProbe:
  tcpSocket: {port: http}
  initialDelaySeconds: 30
  periodSeconds: 30
  failureThreshold: 4
{{- else -}}
{{- include "fleetsight.probes" (dict "ready" "/metrics") }}
{{- end }}
{{- end -}}

{{/* A PodMonitor/ServiceMonitor endpoint's scheme, TLS and basic auth, from the metrics-auth Secret. */}}
{{- define "fleetsight.metricsEndpointAuth" -}}
{{- if .Values.metricsAuth.enabled -}}
{{- $secret := include "fleetsight.metricsAuthSecret" . -}}
scheme: https
tlsConfig:
  serverName: {{ .Values.metricsAuth.serverName }}
  ca:
    secret: {name: {{ $secret }}, key: ca.crt}
basicAuth:
  username: {name: {{ $secret }}, key: username}
  password: {name: {{ $secret }}, key: password}
{{- end }}
{{- end -}}

{{/* A node-local Service in front of a DaemonSet's port named http (internalTrafficPolicy: Local): a pod
that connects to it reaches the pod of its own node, or nothing (then the light checks say `unreachable`,
never another node's figures). What the light checks read the chart's exporters through. */}}
{{- define "fleetsight.nodeLocalService" -}}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "fleetsight.name" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "fleetsight.labels" . | nindent 4 }}
spec:
  internalTrafficPolicy: Local
  selector:
    {{- include "fleetsight.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ .port }}
      targetPort: http
{{- end -}}

{{/* Where the light-check pod mounts the credentials it reads the exporters with: the chart's own
(metricsAuth's Secret: ca.crt and password) and an external dcgm-exporter's (its CA, its password). */}}
{{- define "fleetsight.lightAuthDir" -}}/etc/fleetsight/exporter-client{{- end -}}
{{- define "fleetsight.lightExternalCaDir" -}}/etc/fleetsight/dcgm-exporter-ca{{- end -}}
{{- define "fleetsight.lightExternalPasswordDir" -}}/etc/fleetsight/dcgm-exporter-password{{- end -}}

{{/* One tools-file entry for an exporter of this chart (the dcgm-exporter, the node agent): its node-local
Service, with metricsAuth's TLS (the chart's CA, the name the certificate is issued for) and basic auth. */}}
{{- define "fleetsight.ownExporterTool" -}}
{{- $root := .root -}}
{{- $auth := $root.Values.metricsAuth -}}
{{- $host := printf "%s.%s.svc" (include "fleetsight.name" .) $root.Release.Namespace -}}
{{- $entry := printf "http://%s:%v/metrics" $host .port -}}
{{- if $auth.enabled -}}
{{- $dir := include "fleetsight.lightAuthDir" $root -}}
{{- $entry = dict "url" (printf "https://%s:%v/metrics" $host .port) "ca_file" (printf "%s/ca.crt" $dir) "server_name" $auth.serverName "username" $auth.username "password_file" (printf "%s/password" $dir) -}}
{{- end -}}
{{- toJson (dict "entry" $entry) -}}
{{- end -}}

{{/* The light checks' tools file (checks/tools.yml's `tools`): dcgm_metrics is the chart's dcgm-exporter
when it deploys one (fleetsight.dcgmExporterMode "chart"), else checks.light.externalDcgmExporter when it has a url, else absent;
node_agent_metrics the chart's node agent when nodeAgent.enabled; checks.light.tools over both. */}}
{{- define "fleetsight.lightTools" -}}
{{- $tools := dict -}}
{{- if eq (include "fleetsight.dcgmExporterMode" .) "chart" -}}
{{- $own := include "fleetsight.ownExporterTool" (dict "root" . "component" "dcgm-exporter" "port" .Values.dcgmExporter.port) | fromJson -}}
{{- $_ := set $tools "dcgm_metrics" $own.entry -}}
{{- else if .Values.checks.light.externalDcgmExporter.url -}}
{{- $ext := .Values.checks.light.externalDcgmExporter -}}
{{- $entry := dict "url" $ext.url -}}
{{- if $ext.caSecret -}}
{{- $_ := set $entry "ca_file" (printf "%s/ca.crt" (include "fleetsight.lightExternalCaDir" .)) -}}
{{- end -}}
{{- with $ext.serverName -}}
{{- $_ := set $entry "server_name" . -}}
{{- end -}}
{{- if $ext.passwordSecret -}}
{{- $_ := set $entry "password_file" (printf "%s/password" (include "fleetsight.lightExternalPasswordDir" .)) -}}
{{- $_ := set $entry "username" (required "checks.light.externalDcgmExporter.username: needed with passwordSecret" $ext.username) -}}
{{- end -}}
{{- if eq (len $entry) 1 -}}
{{- $_ := set $tools "dcgm_metrics" $ext.url -}}
{{- else -}}
{{- $_ := set $tools "dcgm_metrics" $entry -}}
{{- end -}}
{{- end -}}
{{- if .Values.nodeAgent.enabled -}}
{{- $own := include "fleetsight.ownExporterTool" (dict "root" . "component" "node-agent" "port" .Values.nodeAgent.port) | fromJson -}}
{{- $_ := set $tools "node_agent_metrics" $own.entry -}}
{{- end -}}
{{- range $name, $entry := .Values.checks.light.tools -}}
{{- $_ := set $tools $name $entry -}}
{{- end -}}
{{- toJson $tools -}}
{{- end -}}

{{/* The light checks that can run: those of checks.light.checks whose tool is in the tools file (each
check's tool as checks/catalog.yml names it). */}}
{{- define "fleetsight.lightToolOf" -}}
{{- toJson (dict "row_remap" "dcgm_metrics" "power_brake" "dcgm_metrics" "link_errors" "dcgm_metrics" "h2d_bandwidth" "node_agent_metrics" "dcgm_diag_r1" "dcgmi") -}}
{{- end -}}

{{- define "fleetsight.lightChecks" -}}
{{- $tools := include "fleetsight.lightTools" . | fromJson -}}
{{- $toolOf := include "fleetsight.lightToolOf" . | fromJson -}}
{{- $run := list -}}
{{- range .Values.checks.light.checks -}}
{{- if hasKey $tools (get $toolOf .) -}}
{{- $run = append $run . -}}
{{- end -}}
{{- end -}}
{{- toJson $run -}}
{{- end -}}

{{/* What the intrusive checks' Jobs run in (checks.images), as the file the scheduler reads: per tool with
an image, the image and whether FleetSight is in it (`images`), and how the tool starts there (`tools`,
checks/tools.yml's format). */}}
{{- define "fleetsight.checkJobs" -}}
{{- $images := dict -}}
{{- $tools := dict -}}
{{- range $tool, $spec := .Values.checks.images -}}
{{- $image := "" -}}
{{- if $spec.repository -}}
{{- $image = printf "%s:%s" $spec.repository (required (printf "checks.images.%s.tag: needed with its repository" $tool) $spec.tag) -}}
{{- else if eq $tool "gpu_probe" -}}
{{- $image = include "fleetsight.image" $ -}}
{{- end -}}
{{- if $image -}}
{{- $_ := set $images $tool (dict "image" $image "fleetsight" $spec.withFleetSight) -}}
{{- $_ := set $tools $tool $spec.command -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "images" $images "tools" $tools) -}}
{{- end -}}

{{/* A dcgm-exporter someone else runs (NVIDIA's GPU operator, NVIDIA's own chart, a hand-made one): with
dcgmExporter.enabled "auto", the first DaemonSet of the cluster (any namespace, not this chart's) whose
container runs NVIDIA's dcgm-exporter image, read with `lookup` at install and upgrade. Two exporters on
one GPU fight over DCGM's profiling module (one reads 0), so a found one is used, never doubled. JSON:
{} when none, else namespace, name, matchLabels and port (its metrics container port's name, or number).
`helm template` has no cluster to ask: nothing is found there. */}}
{{/* How often a dcgm-exporter container collects (ms): DCGM_EXPORTER_INTERVAL in its env, else its
`-c N` / `--collect-interval N` (or `=N`) argument, else dcgm-exporter's own default, 30000. A DCGM
profiling sample averages its collection interval, so the straggler detector's 30 s window holds one
value at the default: it wants 5000 (docs/anomaly.md, "Sampling cadence"). */}}
{{- define "fleetsight.dcgmCollectIntervalMs" -}}
{{- $ms := "" -}}
{{- range .env | default list -}}{{- if eq .name "DCGM_EXPORTER_INTERVAL" -}}{{- $ms = toString .value -}}{{- end -}}{{- end -}}
{{- if not $ms -}}
{{- $args := concat (.command | default list) (.args | default list) -}}
{{- range $i, $arg := $args -}}
{{- if and (not $ms) (has $arg (list "-c" "--collect-interval" "-collect-interval")) (lt (add1 $i) (len $args)) -}}{{- $ms = toString (index $args (add1 $i)) -}}{{- end -}}
{{- if and (not $ms) (regexMatch "^--?c(ollect-interval)?=[0-9]+$" (toString $arg)) -}}{{- $ms = regexReplaceAll "^.*=" (toString $arg) "" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $ms | default "30000" -}}
{{- end -}}

{{- define "fleetsight.dcgmExporterFound" -}}
{{- $found := dict -}}
{{- if eq (toString .Values.dcgmExporter.enabled) "auto" -}}
{{- range (lookup "apps/v1" "DaemonSet" "" "").items | default list -}}
{{- $ds := . -}}
{{- $ours := eq (index ($ds.metadata.labels | default dict) "app.kubernetes.io/name" | default "") "fleetsight" -}}
{{- range $ds.spec.template.spec.containers -}}
{{- if and (not $ours) (not $found.name) (contains "dcgm-exporter" (toString .image)) -}}
{{- $port := "9400" -}}
{{- with .ports -}}{{- $first := first . -}}{{- $port = $first.name | default (toString $first.containerPort) -}}{{- end -}}
{{- $found = dict "namespace" $ds.metadata.namespace "name" $ds.metadata.name "matchLabels" $ds.spec.selector.matchLabels "port" $port "intervalMs" (include "fleetsight.dcgmCollectIntervalMs" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $found -}}
{{- end -}}

{{/* Which dcgm-exporter FleetSight reads: "chart" (this chart's DaemonSet: enabled true, or "auto" with
none found and none named), "found" (enabled "auto" and another one runs: fleetsight.dcgmExporterFound),
"off" (false, or "auto" with checks.light.externalDcgmExporter.url naming the one the site runs). */}}
{{- define "fleetsight.dcgmExporterMode" -}}
{{- $enabled := .Values.dcgmExporter.enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if (include "fleetsight.dcgmExporterFound" . | fromJson).name -}}found
{{- else if .Values.checks.light.externalDcgmExporter.url -}}off
{{- else -}}chart{{- end -}}
{{- else if $enabled -}}chart
{{- else -}}off
{{- end -}}
{{- end -}}
