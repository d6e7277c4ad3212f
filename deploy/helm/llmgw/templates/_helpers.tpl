{{/* The release's resource name, at most 63 characters. */}}
{{- define "llmgw.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llmgw.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "llmgw.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{/* The Secret and key holding the admin token. */}}
{{- define "llmgw.tokenSecret" -}}
{{- .Values.adminToken.existingSecret | default (include "llmgw.fullname" .) -}}
{{- end -}}
{{- define "llmgw.tokenKey" -}}
{{- if .Values.adminToken.existingSecret -}}{{ .Values.adminToken.existingSecretKey }}{{- else -}}admin-token{{- end -}}
{{- end -}}

{{/* The Secret and key holding the store URL. */}}
{{- define "llmgw.storeSecret" -}}
{{- if and (eq .Values.store.type "postgresql") .Values.store.postgresql.existingSecret -}}
{{- .Values.store.postgresql.existingSecret -}}
{{- else -}}
{{- include "llmgw.fullname" . -}}
{{- end -}}
{{- end -}}
{{- define "llmgw.storeKey" -}}
{{- if and (eq .Values.store.type "postgresql") .Values.store.postgresql.existingSecret -}}
{{- .Values.store.postgresql.existingSecretKey -}}
{{- else -}}store-url{{- end -}}
{{- end -}}

{{- define "llmgw.claim" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "llmgw.fullname" .)) -}}
{{- end -}}
