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

{{/*
Resources the device plugin serves, as a JSON list; [] means every resource found. With the DRA
driver enabled: config.resources minus nothing (a resource of a DRA profile there is an error),
or, when config.resources is empty, every resource of the profiles the DRA driver leaves alone.
*/}}
{{- define "actk-device-plugin.resources" -}}
{{- $res := .Values.config.resources -}}
{{- if .Values.dra.enabled -}}
{{- $dra := list -}}
{{- range $p := .Values.dra.profiles -}}
{{- $prof := index $.Values.profiles $p -}}
{{- if not $prof -}}{{- fail (printf "dra.profiles names %q, which is not in .Values.profiles; add it there with its kind and resources" $p) -}}{{- end -}}
{{- $dra = concat $dra $prof.resources -}}
{{- end -}}
{{- if $res -}}
{{- range $r := $res -}}
{{- if has $r $dra -}}{{- fail (printf "config.resources has %s, but the DRA driver serves its profile (dra.profiles): a kind is served by one of them, never both; remove it from one list" $r) -}}{{- end -}}
{{- end -}}
{{- else -}}
{{- range $name, $prof := .Values.profiles -}}
{{- if not (has $name $.Values.dra.profiles) -}}{{- $res = concat $res $prof.resources -}}{{- end -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled (not $res) -}}
{{- fail "the DRA driver serves every profile (dra.profiles), so the device plugin has nothing left: set devicePlugin.enabled=false" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $res | toJson -}}
{{- end -}}

{{/* Labels of the DRA driver's pods: another name, so the device plugin's selector never matches them. */}}
{{- define "actk-device-plugin.draSelector" -}}
app.kubernetes.io/name: actk-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of the NRI plugin's pods: their own name, as the DRA driver's. */}}
{{- define "actk-device-plugin.nriSelector" -}}
app.kubernetes.io/name: actk-nri
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
recursiveReadOnly of a read-only hostPath mount of a whole root: its submounts (/proc, /sys,
/run, a separate /var) read-only too where the kubelet and runtime can (Kubernetes 1.30+, a
runtime and kernel with recursive read-only mounts); elsewhere as plain readOnly. A read-only
mount does not stop a process from connecting to a socket under it.
*/}}
{{- define "actk.recursiveReadOnly" -}}
{{- if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version }}recursiveReadOnly: IfPossible{{ end -}}
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
{{- if .Values.nodeSetup.enabled }}{{ printf "%s/actk-hook" (trimSuffix "/" .Values.nodeSetup.installDir) }}{{ else }}none{{ end -}}
{{- else -}}
{{- .Values.cdi.ldcacheHook -}}
{{- end -}}
{{- end -}}
