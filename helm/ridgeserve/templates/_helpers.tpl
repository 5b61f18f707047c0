{{/* Names and labels. */}}
{{- define "ridgeserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ridgeserve.fullname" -}}
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

{{- define "ridgeserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ridgeserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ridgeserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ridgeserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ridgeserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ridgeserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ridgeserve.image" -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion .Values.backend) .Values.image.tag }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "ridgeserve.claimName" -}}
{{- default (printf "%s-models" (include "ridgeserve.fullname" .)) .Values.modelStorage.existingClaim }}
{{- end }}

{{/* Seconds from the start of termination to the end of the drain, and the grace period. */}}
{{- define "ridgeserve.drainSeconds" -}}
{{- add (int .Values.preStopSleepSeconds) (int .Values.server.shutdownTimeoutSeconds) }}
{{- end }}

{{- define "ridgeserve.gracePeriod" -}}
{{- add (include "ridgeserve.drainSeconds" . | int) (int .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/* Cross-field checks the schema cannot say clearly (values.schema.json has the rest). */}}
{{- define "ridgeserve.validate" -}}
{{- if hasKey (default dict .Values.resources.limits) "nvidia.com/gpu" }}
{{- fail "resources.limits.nvidia.com/gpu is set from tensorParallel on the cuda backend; remove it from resources" }}
{{- end }}
{{- end }}
