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
{{- if and .Values.dra.enabled (not .Values.dra.perNodeServer.enabled) -}}
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

{{/* Whether the chart's DeviceClasses carry spec.extendedResourceName (KEP-5004): dra.extendedResourceNames
true or false, or auto: where the cluster serves it on by default (Kubernetes 1.36+, where DRAExtendedResource is
beta, GA in 1.37). The field is in resource.k8s.io/v1 since 1.34 (alpha): on 1.34 or 1.35 with the gate on, set true;
an API server with the gate off drops the field. Prints "true" or nothing. */}}
{{- define "actk-device-plugin.extendedResourceNames" -}}
{{- $v := toString .Values.dra.extendedResourceNames -}}
{{- if eq $v "true" -}}true
{{- else if eq $v "auto" -}}{{- if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- else if ne $v "false" -}}{{- fail (printf "dra.extendedResourceNames is %q: give auto, true or false" $v) -}}
{{- end -}}
{{- end -}}

{{/* The DRA driver's servers file on the node (crates/actk-dra/src/servers.rs): the profiles it serves there, which
the device plugin leaves alone (dra.perNodeServer). */}}
{{- define "actk-device-plugin.draServersFile" -}}
{{- printf "%s/actk.dev/servers.json" .Values.dra.kubeletPluginsDir -}}
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

{{/* Labels of the exporter's pods and the labeller's: names of their own, as the NRI plugin's. */}}
{{- define "actk-device-plugin.exporterSelector" -}}
app.kubernetes.io/name: actk-exporter
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "actk-device-plugin.labellerSelector" -}}
app.kubernetes.io/name: actk-node-labeller
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
{{- if has "device-specs" (include "actk.strategies" . | fromJsonArray) }}true{{ end -}}
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

{{/*
Every value the chart has a default for, present: an upgrade with `--reuse-values` from an earlier
revision of this chart renders the templates with that revision's values only (Helm merges none
of this chart's defaults then), so a key added since (nri, sharing, ...) would be a nil pointer.
files/defaults.yaml is a copy of values.yaml (a test keeps them equal; Helm does not give
templates values.yaml itself); values given keep theirs. Every template includes this first.
*/}}
{{- define "actk.defaults" -}}
{{- include "actk.fill" (dict "dst" .Values "src" (.Files.Get "files/defaults.yaml" | fromYaml)) -}}
{{- end -}}

{{/*
Sets every key of .src that .dst lacks (or has as null), recursing into maps both have. Not
sprig's merge: it also replaces values that are false, 0 or "" (devicePlugin.enabled=false).
*/}}
{{- define "actk.fill" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- $have := get $dst $k -}}
{{- if or (not (hasKey $dst $k)) (kindIs "invalid" $have) -}}
{{- $_ := set $dst $k $v -}}
{{- else if and (kindIs "map" $v) (kindIs "map" $have) -}}
{{- include "actk.fill" (dict "dst" $have "src" $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The Allocate strategies, as a JSON list: config.strategies, or NVIDIA's deviceListStrategy (a
name or a comma-separated list of them, the same names); compatWithCPUManager adds device-specs
(the kubelet then passes the device nodes, as NVIDIA's --pass-device-specs does).
*/}}
{{- define "actk.strategies" -}}
{{- $s := .Values.config.strategies -}}
{{- with .Values.deviceListStrategy -}}
{{- $nv := list -}}
{{- if kindIs "slice" . }}{{ $nv = . }}{{ else }}{{ range (splitList "," (toString .)) }}{{ $nv = append $nv (trim .) }}{{ end }}{{ end -}}
{{- if and (ne (toJson $s) (toJson (list "cdi-cri"))) (ne (toJson $s) (toJson $nv)) -}}
{{- fail (printf "deviceListStrategy (NVIDIA's name) is %s but config.strategies is %s: set one of them" (toJson $nv) (toJson $s)) -}}
{{- end -}}
{{- $s = $nv -}}
{{- end -}}
{{- if and .Values.compatWithCPUManager (not (has "device-specs" $s)) -}}
{{- $s = append $s "device-specs" -}}
{{- end -}}
{{- $s | toJson -}}
{{- end -}}

{{/* Whole-device IDs: config.deviceIds, or NVIDIA's deviceIDStrategy (uuid or index). */}}
{{- define "actk.deviceIds" -}}
{{- $d := .Values.config.deviceIds -}}
{{- with .Values.deviceIDStrategy -}}
{{- if and (ne $d "uuid") (ne $d .) }}{{ fail (printf "deviceIDStrategy (NVIDIA's name) is %q but config.deviceIds is %q: set one of them" . $d) }}{{ end -}}
{{- $d = . -}}
{{- end -}}
{{- $d -}}
{{- end -}}

{{/*
The MIG strategy: config.migStrategy, or NVIDIA's chart key migStrategy at the top level, or
flags.migStrategy (NVIDIA's config file key, often put in chart values); two that differ are
refused.
*/}}
{{- define "actk.migStrategy" -}}
{{- $m := .Values.config.migStrategy | default "none" -}}
{{- $flags := .Values.flags | default dict -}}
{{- range $name, $v := dict "migStrategy" $.Values.migStrategy "flags.migStrategy" (get $flags "migStrategy") -}}
{{- if $v -}}
{{- if not (has (toString $v) (list "none" "single" "mixed")) }}{{ fail (printf "%s: %q is not a MIG strategy: use none, single or mixed" $name (toString $v)) }}{{ end -}}
{{- if and (ne $m "none") (ne $m (toString $v)) }}{{ fail (printf "%s is %q but config.migStrategy is %q: set one of them" $name (toString $v) $m) }}{{ end -}}
{{- $m = toString $v -}}
{{- end -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/*
Values of NVIDIA's nvidia-device-plugin chart that actk's chart does not honour: refused with
the fix, unless they are at NVIDIA's defaults (which ask for nothing actk does not do). Honoured
elsewhere: migStrategy, flags.migStrategy, deviceListStrategy, deviceIDStrategy,
compatWithCPUManager, config.name/map/default, updateStrategy, imagePullSecrets, podAnnotations,
affinity, devicePlugin.enabled, priorityClassName, nodeSelector, tolerations, resources, image.
*/}}
{{- define "actk.nvidiaCompat" -}}
{{- $v := .Values -}}
{{- $no := dict
  "failOnInitError" "actk's plugin never exits for a node without devices or a driver not loaded yet: it looks again every 5 s, and its pod's readiness says whether it serves; remove failOnInitError"
  "gdsEnabled" "actk mounts no GPUDirect Storage files by itself: describe them in a user profile (profiles.d) or a CDI spec; remove gdsEnabled"
  "mofedEnabled" "actk mounts no MOFED files by itself: describe them in a user profile (profiles.d) or a CDI spec; remove mofedEnabled"
  "gdrcopyEnabled" "actk mounts no gdrcopy files by itself: describe them in a user profile (profiles.d) or a CDI spec; remove gdrcopyEnabled"
  "nvidiaDriverRoot" "set hostRoot instead (actk's name: where the node's devices and driver are, e.g. /run/nvidia/driver)"
  "runtimeClassName" "actk's pods need no runtime class (they read the node's devices themselves); remove runtimeClassName"
  "nameOverride" "objects are named after the release: choose the release name (helm install NAME)"
  "fullnameOverride" "objects are named after the release: choose the release name (helm install NAME)"
  "namespaceOverride" "install into the namespace you want with helm --namespace"
-}}
{{- range $key, $fix := $no -}}
{{- if get $v $key }}{{ fail (printf "%s (a value of NVIDIA's chart) is not supported by actk's chart: %s" $key $fix) }}{{ end -}}
{{- end -}}
{{- with $v.deviceDiscoveryStrategy -}}
{{- if ne (toString .) "auto" }}{{ fail (printf "deviceDiscoveryStrategy %q (a value of NVIDIA's chart) is not supported: actk discovers devices with its vendor profiles (and NVML where there is one); remove it" (toString .)) }}{{ end -}}
{{- end -}}
{{- range $key := list "selectorLabelsOverride" "podSecurityContext" "securityContext" -}}
{{- if get $v $key }}{{ fail (printf "%s (a value of NVIDIA's chart) is not supported by actk's chart: its pods run unprivileged with every capability dropped, a read-only root filesystem and labels of their own; remove %s" $key $key) }}{{ end -}}
{{- end -}}
{{- range $key, $val := ($v.flags | default dict) -}}
{{- if ne $key "migStrategy" }}{{ fail (printf "flags.%s is a key of NVIDIA's config file, not of a chart: put that file in config.map (or a ConfigMap named by config.name); actk's chart reads flags.migStrategy only" $key) }}{{ end -}}
{{- end -}}
{{- if (($v.gfd | default dict).enabled) }}{{ fail "gfd.enabled: GPU feature discovery is not part of actk's chart; install NVIDIA's gpu-feature-discovery on its own, or set gfd.enabled=false" }}{{ end -}}
{{- with (($v.mps | default dict).root) -}}
{{- if ne (trimSuffix "/" (toString .)) "/run/nvidia/mps" }}{{ fail (printf "mps.root %q (NVIDIA's MPS daemon root) is not used by actk, which runs no MPS daemon: set sharing.mps.pipeDirectory to the pipe directory of the node's MPS daemon" (toString .)) }}{{ end -}}
{{- end -}}
{{- range $key := list "nvidiaHookPath" "featureFlags" -}}
{{- if get ($v.cdi | default dict) $key }}{{ fail (printf "cdi.%s (a value of NVIDIA's chart) is not supported: actk's specs carry actk-hook for the ld.so.cache (cdi.ldcacheHook); remove cdi.%s" $key $key) }}{{ end -}}
{{- end -}}
{{- if (($v.devicePlugin | default dict).containers) }}{{ fail "devicePlugin.containers (NVIDIA's per-container settings) is not supported: set extraEnv and extraArgs for the plugin's container" }}{{ end -}}
{{- /* Names of earlier revisions of this chart, in values an upgrade with --reuse-values keeps. */ -}}
{{- with (($v.dra | default dict).hostRoot) -}}
{{- if ne (toString .) (toString $v.hostRoot) }}{{ fail (printf "dra.hostRoot %q (an earlier revision of this chart) is now hostRoot, for every part: set hostRoot=%s" (toString .) (toString .)) }}{{ end -}}
{{- end -}}
{{- with (($v.dra | default dict).ldcacheHook) -}}
{{- fail (printf "dra.ldcacheHook %q (an earlier revision of this chart) is now cdi.ldcacheHook, for every part: set cdi.ldcacheHook=%s" (toString .) (toString .)) -}}
{{- end -}}
{{- $c := $v.config -}}
{{- if and $c.name $c.map }}{{ fail "config.name and config.map are both set: use one (name: an existing ConfigMap in NVIDIA's config format; map: configs written in these values)" }}{{ end -}}
{{- if $c.map -}}
{{- $keys := keys $c.map | sortAlpha -}}
{{- if and $c.default (not (has $c.default $keys)) }}{{ fail (printf "config.default %q is not a key of config.map (%s)" $c.default (join ", " $keys)) }}{{ end -}}
{{- if and (not $c.default) (gt (len $keys) 1) (not (has "default" $keys)) }}{{ fail (printf "config.map has %s: set config.default to the config of nodes without the node label actk.dev/config (or name one key default)" (join ", " $keys)) }}{{ end -}}
{{- end -}}
{{- end -}}

{{/* NVIDIA's ConfigMap in use (config.name, or the chart's own for config.map), or "". */}}
{{- define "actk.nvidiaConfigMap" -}}
{{- if .Values.config.name }}{{ .Values.config.name }}{{ else if .Values.config.map }}{{ include "actk-device-plugin.fullname" . }}-nvidia-config{{ end -}}
{{- end -}}

{{/* Whether the plugin may share GPUs through MPS (its pipe directory is then mounted). */}}
{{- define "actk.mps" -}}
{{- if or .Values.sharing.mps.resources (include "actk.nvidiaConfigMap" .) }}true{{ end -}}
{{- end -}}

{{/* Pod fields every DaemonSet takes from the values: pull secrets and affinity. */}}
{{- define "actk.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* `devices = ...` of a shared resource entry, as TOML (NVIDIA's `all` or a list), or "". */}}
{{- define "actk.devicesToml" -}}
{{- with .devices -}}
{{- if kindIs "slice" . -}}
devices = [{{ range $i, $d := . }}{{ if $i }}, {{ end }}{{ toString $d | toJson }}{{ end }}]
{{- else -}}
devices = {{ toString . | toJson }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The telemetry grant's resource name when the chart serves it, else empty (values.yaml
exporter.deviceGrant): the exporter and the device plugin follow it. Served only where its
ValidatingAdmissionPolicy is installed ("actk.telemetryGrantPolicy"), so never unguarded.
*/}}
{{- define "actk.telemetryGrant" -}}
{{- $e := .Values.exporter -}}
{{- if and $e.enabled $e.deviceGrant.enabled (not $e.privileged) (include "actk.telemetryGrantPolicy" .) -}}
actk.dev/telemetry
{{- end -}}
{{- end -}}

{{/*
"true" when the telemetry grant's ValidatingAdmissionPolicy is installed (telemetry-grant.yaml):
with the device plugin, on a cluster with the API, whatever the exporter's values. A plugin pod
of an earlier revision may still serve the grant during the rollout that turns it off, and the
policy must outlive it.
*/}}
{{- define "actk.telemetryGrantPolicy" -}}
{{- if and .Values.devicePlugin.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}
