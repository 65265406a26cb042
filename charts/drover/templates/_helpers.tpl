{{/* Chart label value: name-version. */}}
{{- define "drover.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "drover.labels" -}}
helm.sh/chart: {{ include "drover.chart" . }}
app.kubernetes.io/name: drover
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: drover
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component; call with (dict "root" $ "component" "manager"). */}}
{{- define "drover.selectorLabels" -}}
app.kubernetes.io/name: drover
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The drover image reference. */}}
{{- define "drover.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The in-cluster DNS names of a Service: name, name.ns, name.ns.svc.
Call with (dict "name" "drover-signer" "ns" .Release.Namespace).
*/}}
{{- define "drover.serviceHosts" -}}
{{ .name }}.{{ .ns }}.svc,{{ .name }}.{{ .ns }},{{ .name }}
{{- end -}}

{{/* Arguments both binaries take. */}}
{{- define "drover.commonArgs" -}}
- --namespace={{ .Release.Namespace }}
- --log-level={{ .Values.logLevel }}
- --health-probe-bind-address=:{{ .Values.probes.port }}
- --metrics-bind-address=:{{ .Values.metrics.port }}
{{- with .Values.featureGates }}
- --feature-gates={{ . }}
{{- end }}
{{- end -}}

{{/* Probes of both: /healthz and /readyz on the probe port. */}}
{{- define "drover.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: probes
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: probes
  periodSeconds: 10
  timeoutSeconds: 5
startupProbe:
  httpGet:
    path: /healthz
    port: probes
  periodSeconds: 5
  # Up to 5 minutes to sync caches against a large cluster.
  failureThreshold: 60
{{- end -}}
