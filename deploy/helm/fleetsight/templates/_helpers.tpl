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
