{{/* The chart's name, truncated to a DNS label. */}}
{{- define "reaper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object. */}}
{{- define "reaper.fullname" -}}
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

{{- define "reaper.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reaper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reaper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "reaper.labels" -}}
helm.sh/chart: {{ include "reaper.chart" . }}
{{ include "reaper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: reaperd
{{- end }}

{{- define "reaper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reaper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The namespace of the task pods and warm workers (the kube substrate's and
the runner's, the pods Role's, the admission policy's and the
NetworkPolicy's peers): taskNamespace.name, by default
<release namespace>-tasks. Never the release's own namespace unless the
operator says so (taskNamespace.allowReleaseNamespace): that namespace holds
reaperd's Secrets and ServiceAccount, which whoever may create pods there
could mount or run as.
*/}}
{{- define "reaper.taskNamespace" -}}
{{- if .Values.config.kube.namespace }}
{{- fail "config.kube.namespace has moved: name the task namespace with taskNamespace.name" }}
{{- end }}
{{- $ns := default (printf "%s-tasks" .Release.Namespace | trunc 63 | trimSuffix "-") .Values.taskNamespace.name }}
{{- if and (eq $ns .Release.Namespace) (not .Values.taskNamespace.allowReleaseNamespace) }}
{{- fail (printf "taskNamespace.name: the task pods would share the release's namespace %s with reaperd's Secrets and ServiceAccount; name another namespace, or set taskNamespace.allowReleaseNamespace=true to accept that whoever may create pods there can reach them" $ns) }}
{{- end }}
{{- $ns }}
{{- end }}

{{/* "true" when the task pods share the release's namespace (acknowledged). */}}
{{- define "reaper.tasksInReleaseNamespace" -}}
{{- if eq (include "reaper.taskNamespace" .) .Release.Namespace }}true{{ end }}
{{- end }}

{{/*
The Secrets reaperd's pods read, as a sorted list of names in a JSON
array: the database's, the attempt API's certificate and signing keys, the
Secrets of extraVolumes (secret and projected sources) and extraEnv
(secretKeyRef), and admissionPolicy.protectedSecrets. The admission policy
refuses any other pod of the task namespace that reads one.
*/}}
{{- define "reaper.secretNames" -}}
{{- $s := list .Values.database.existingSecret .Values.attemptApi.tls.existingSecret .Values.attemptApi.signingKeys.existingSecret }}
{{- range .Values.extraVolumes }}
{{- with .secret }}{{ $s = append $s .secretName }}{{ end }}
{{- with .projected }}
{{- range .sources }}
{{- with .secret }}{{ $s = append $s .name }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv }}
{{- with .valueFrom }}{{ with .secretKeyRef }}{{ $s = append $s .name }}{{ end }}{{ end }}
{{- end }}
{{- $s = concat $s (.Values.admissionPolicy.protectedSecrets | default list) }}
{{- without $s "" nil | uniq | sortAlpha | toJson }}
{{- end }}

{{- define "reaper.leaseName" -}}
{{- default (include "reaper.fullname" .) .Values.config.leader.name }}
{{- end }}

{{- define "reaper.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
An HCL literal: a string as a JSON string (also valid HCL) with HCL's
template sequences escaped; a number or a bool as is.
*/}}
{{- define "reaper.hcl" -}}
{{- if kindIs "string" . }}
{{- toJson . | replace "${" "$${" | replace "%{" "%%{" }}
{{- else if or (kindIs "bool" .) (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- toString . }}
{{- else }}
{{- fail (printf "reaper chart: %v is not a string, a number or a bool" .) }}
{{- end }}
{{- end }}

{{/* The attributes of a map, sorted, one per line, empty strings left out. */}}
{{- define "reaper.hclAttrs" -}}
{{- $m := .map }}
{{- range $k := keys $m | sortAlpha }}
{{- $v := index $m $k }}
{{- if not (and (kindIs "string" $v) (eq $v "")) }}
{{ $.indent }}{{ $k }} = {{ include "reaper.hcl" $v }}
{{- end }}
{{- end }}
{{- end }}

{{/* The reapers in the order they run. */}}
{{- define "reaper.reaperOrder" -}}
podlost dispatchlost agentlost warmworker orphanrun
{{- end }}

{{/* "true" when the attempt API is served to the cluster: asked for, or needed by the kube runner's pods. */}}
{{- define "reaper.attemptApiOn" -}}
{{- if or .Values.attemptApi.enabled .Values.config.runner.enabled }}true{{ end }}
{{- end }}

{{- define "reaper.attemptApiService" -}}
{{- printf "%s-attempt-api" (include "reaper.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The attempt API's URL as the pods reach it: its Service's in-cluster name, which its certificate must cover. */}}
{{- define "reaper.attemptApiURL" -}}
{{- printf "https://%s.%s.svc:%d" (include "reaper.attemptApiService" .) .Release.Namespace (int .Values.attemptApi.service.port) }}
{{- end }}
