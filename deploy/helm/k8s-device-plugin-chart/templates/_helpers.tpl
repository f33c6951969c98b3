{{/*
The application's name: "rbln-device-plugin" unless nameOverride is set.
*/}}
{{- define "rbln-device-plugin.name" -}}
{{- default "rbln-device-plugin" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name of the release's objects (at most 63 characters): fullnameOverride, else the release
name when it already contains the application's name, else "<release>-<name>".
*/}}
{{- define "rbln-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "rbln-device-plugin.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "rbln-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels that select the DaemonSet's pods; they must never change between releases.
*/}}
{{- define "rbln-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rbln-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Standard labels of every object.
*/}}
{{- define "rbln-device-plugin.labels" -}}
helm.sh/chart: {{ include "rbln-device-plugin.chart" . }}
{{ include "rbln-device-plugin.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: rbln-npu
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The ServiceAccount the pods run as.
*/}}
{{- define "rbln-device-plugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rbln-device-plugin.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The plugin image: image.repository:image.tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "rbln-device-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The partition gate's image: partitionReadyGate.image.repository (with its tag when one is given) when
set, else the plugin's own image.
*/}}
{{- define "rbln-device-plugin.gateImage" -}}
{{- $gate := .Values.partitionReadyGate.image -}}
{{- if and $gate.repository $gate.tag -}}
{{- printf "%s:%s" $gate.repository $gate.tag -}}
{{- else if $gate.repository -}}
{{- $gate.repository -}}
{{- else -}}
{{- include "rbln-device-plugin.image" . -}}
{{- end -}}
{{- end -}}

{{- define "rbln-device-plugin.gatePullPolicy" -}}
{{- if .Values.partitionReadyGate.image.repository -}}
{{- .Values.partitionReadyGate.image.pullPolicy | default "IfNotPresent" -}}
{{- else -}}
{{- .Values.image.pullPolicy -}}
{{- end -}}
{{- end -}}

{{/*
The plugin container's mounts, as a YAML list of {name, hostPath, type, mountPath, readOnly,
propagation} (hostPath volumes) and {name, mountPath, emptyDir} (the private run dir). The
DaemonSet renders each as a volume plus a volumeMount, drops an entry whose mountPath an earlier
entry already has (two settings may name one directory) and orders the mounts parents first.
*/}}
{{- define "rbln-device-plugin.hostMounts" -}}
{{- $paths := .Values.paths -}}
- name: kubelet-device-plugins
  hostPath: {{ $paths.kubeletDevicePluginPath | quote }}
  type: DirectoryOrCreate
  mountPath: {{ $paths.kubeletDevicePluginPath | quote }}
  readOnly: false
- name: cdi-root
  hostPath: {{ $paths.cdiRoot | quote }}
  type: DirectoryOrCreate
  mountPath: {{ $paths.cdiRoot | quote }}
  readOnly: false
- name: dev
  hostPath: {{ $paths.devRoot | quote }}
  type: Directory
  mountPath: {{ $paths.devRoot | quote }}
  readOnly: false
- name: sys
  hostPath: {{ $paths.sysfsRoot | quote }}
  type: Directory
  mountPath: {{ $paths.sysfsRoot | quote }}
  readOnly: true
- name: run-rbln
  hostPath: /run/rbln
  type: DirectoryOrCreate
  mountPath: /run/rbln
  readOnly: false
  propagation: HostToContainer
- name: rsd-lock-dir
  hostPath: {{ dir $paths.rsdLockFile | quote }}
  type: DirectoryOrCreate
  mountPath: {{ dir $paths.rsdLockFile | quote }}
  readOnly: false
{{- if .Values.hostRblnSmi }}
- name: host-usr-bin
  hostPath: /usr/bin
  type: Directory
  mountPath: /host/usr/bin
  readOnly: true
- name: host-driver-usr-bin
  hostPath: /run/rbln/driver/usr/bin
  type: DirectoryOrCreate
  mountPath: /host/driver/usr/bin
  readOnly: true
  propagation: HostToContainer
{{- end }}
{{- if and .Values.logging.dir .Values.logging.hostPath }}
- name: log-dir
  hostPath: {{ .Values.logging.dir | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.logging.dir | quote }}
  readOnly: false
{{- end }}
- name: run-dir
  mountPath: {{ $paths.runDir | quote }}
  emptyDir: true
{{- end -}}

{{/*
The mounts of "rbln-device-plugin.hostMounts", each mountPath once, sorted by path depth (then by
their order in the list) so that a directory is mounted before anything beneath it. /var/run counts
as /run: it is a symlink to /run in the image, so a mount at /var/run covers /run.
*/}}
{{- define "rbln-device-plugin.orderedMounts" -}}
{{- $seen := dict -}}
{{- $byKey := dict -}}
{{- $keys := list -}}
{{- range $index, $mount := (include "rbln-device-plugin.hostMounts" . | fromYamlArray) -}}
{{- if not (hasKey $seen $mount.mountPath) -}}
{{- $_ := set $seen $mount.mountPath true -}}
{{- $resolved := regexReplaceAll "^/var/run(/|$)" (clean $mount.mountPath) "/run${1}" -}}
{{- $key := printf "%03d-%03d" (len (splitList "/" $resolved)) $index -}}
{{- $_ := set $byKey $key $mount -}}
{{- $keys = append $keys $key -}}
{{- end -}}
{{- end -}}
{{- $ordered := list -}}
{{- range (sortAlpha $keys) -}}
{{- $ordered = append $ordered (get $byKey .) -}}
{{- end -}}
{{- toYaml $ordered -}}
{{- end -}}
