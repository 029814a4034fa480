{{/* Name of every object of this release. */}}
{{- define "actk-device-plugin.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels shared by every object. */}}
{{- define "actk-device-plugin.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "actk-device-plugin.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The host root without a trailing slash ("" for "/"): node path P is at /host<P> in a pod. */}}
{{- define "actk.root" -}}
{{- trimSuffix "/" .Values.hostRoot -}}
{{- end -}}

{{/* Whether the plugin gets the whole host root read-only (device-specs sends driver files). */}}
{{- define "actk.hostLibraries" -}}
{{- if eq (toString .Values.hostLibraries) "auto" -}}
{{- if has "device-specs" .Values.config.strategies }}true{{ end -}}
{{- else if .Values.hostLibraries -}}true{{- end -}}
{{- end -}}

{{/* The spec directory generated specs go to: the last (highest priority) one. */}}
{{- define "actk.specDir" -}}
{{- last .Values.cdi.specDirs -}}
{{- end -}}

{{/* The image of every part. */}}
{{- define "actk.image" -}}
"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
{{- end -}}

{{/* securityContext of every container: no privilege, no capability, read-only root. */}}
{{- define "actk.securityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsUser: 0
runAsNonRoot: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The ld.so.cache hook path for generated specs, or none. */}}
{{- define "actk.ldcacheHook" -}}
{{- if eq .Values.cdi.ldcacheHook "auto" -}}
{{- if .Values.nodeSetup.enabled }}{{ printf "%s/bin/actk-hook" (trimSuffix "/" .Values.nodeSetup.installDir) }}{{ else }}none{{ end -}}
{{- else -}}
{{- .Values.cdi.ldcacheHook -}}
{{- end -}}
{{- end -}}
