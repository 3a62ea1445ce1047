{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "kvpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: <release>-<chart>, or the release alone when it already says kvpilot. */}}
{{- define "kvpilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvpilot.operator.fullname" -}}
{{- printf "%s-operator" (include "kvpilot.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvpilot.gateway.fullname" -}}
{{- printf "%s-gateway" (include "kvpilot.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object of the release carries. */}}
{{- define "kvpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kvpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvpilot
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "kvpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpilot.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kvpilot.componentLabels" -}}
{{ include "kvpilot.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference; call with (dict "ctx" $ "image" .Values.operator.image). */}}
{{- define "kvpilot.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* True (non-empty) when the release watches one namespace instead of all. */}}
{{- define "kvpilot.namespaced" -}}
{{- if .Values.watchNamespace }}true{{ end }}
{{- end }}

{{/* Kind of the role holding the watch-scope rules: Role when namespaced, ClusterRole otherwise. */}}
{{- define "kvpilot.roleKind" -}}
{{- if include "kvpilot.namespaced" . }}Role{{ else }}ClusterRole{{ end }}
{{- end }}

{{/* The Lease the gateway replicas elect their autoscaling leader with. */}}
{{- define "kvpilot.gateway.leaseName" -}}
{{- printf "%s-autoscaler" (include "kvpilot.gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of the Secret holding the gateway's API keys. */}}
{{- define "kvpilot.gateway.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "kvpilot.gateway.fullname" .)) .Values.gateway.apiKeys.existingSecret }}
{{- end }}

{{/* The writable scratch volume mounted at /tmp (the root filesystem is read-only). */}}
{{- define "kvpilot.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
