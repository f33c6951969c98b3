{{/*
The application's name: the chart's name ("k8s-device-plugin-chart") unless nameOverride is set.
*/}}
{{- define "rbln-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of the release's objects (at most 63 characters): fullnameOverride, else the application's
name. As in the original chart the release name is not part of it, so an upgrade of a release made
with that chart keeps its DaemonSet.
*/}}
{{- define "rbln-device-plugin.fullname" -}}
{{- default (include "rbln-device-plugin.name" .) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The namespace of every object: namespaceOverride, else the release's.
*/}}
{{- define "rbln-device-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "rbln-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels that select the DaemonSet's pods; they must never change between releases. The defaults,
with selectorLabelsOverride added (its value wins for a key both have).
*/}}
{{- define "rbln-device-plugin.selectorLabels" -}}
{{- $defaults := dict "app.kubernetes.io/name" (include "rbln-device-plugin.name" .) "app.kubernetes.io/instance" .Release.Name -}}
{{- merge (deepCopy (.Values.selectorLabelsOverride | default dict)) $defaults | toYaml -}}
{{- end -}}

{{/*
Standard labels of every object, the selector's among them (they win over the others).
*/}}
{{- define "rbln-device-plugin.labels" -}}
{{- $labels := dict "helm.sh/chart" (include "rbln-device-plugin.chart" .) "app.kubernetes.io/component" "device-plugin" "app.kubernetes.io/part-of" "rbln-npu" "app.kubernetes.io/managed-by" .Release.Service -}}
{{- with .Chart.AppVersion -}}
{{- $_ := set $labels "app.kubernetes.io/version" . -}}
{{- end -}}
{{- merge (include "rbln-device-plugin.selectorLabels" . | fromYaml) $labels | toYaml -}}
{{- end -}}

{{/*
The pods' labels: the standard labels and podLabels, which cannot change a standard one (the
selector must keep matching).
*/}}
{{- define "rbln-device-plugin.podLabels" -}}
{{- merge (include "rbln-device-plugin.labels" . | fromYaml) (deepCopy (.Values.podLabels | default dict)) | toYaml -}}
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
Read-write only where the stack writes: sockets in the kubelet's directory, stale CDI specs
removed (the CDI root; the other CDI spec dirs are only read), the RSD lock (the one file, not its directory, which is the node's /run by default),
device nodes, the log dir and, with featureDiscovery.enabled, NFD's feature directory. docs/security.md says why each is there; tests/deploy/test_chart.py
fails on a new read-write one.
*/}}
{{- define "rbln-device-plugin.hostMounts" -}}
{{- $paths := .Values.paths -}}
- name: kubelet-device-plugins
  hostPath: {{ .Values.devicePlugin.kubeletDevicePluginPath | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.devicePlugin.kubeletDevicePluginPath | quote }}
  readOnly: false
- name: kubelet-pod-resources
  hostPath: {{ dir $paths.kubeletPodResourcesSocket | quote }}
  type: DirectoryOrCreate
  mountPath: {{ dir $paths.kubeletPodResourcesSocket | quote }}
  readOnly: true
- name: cdi-root
  hostPath: {{ .Values.devicePlugin.cdiRoot | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.devicePlugin.cdiRoot | quote }}
  readOnly: false
{{- range $index, $dir := .Values.devicePlugin.cdiSpecDirs }}
- name: cdi-spec-dir-{{ $index }}
  hostPath: {{ $dir | quote }}
  type: DirectoryOrCreate
  mountPath: {{ $dir | quote }}
  readOnly: true
{{- end }}
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
  readOnly: true
  propagation: HostToContainer
- name: rsd-lock
  hostPath: {{ $paths.rsdLockFile | quote }}
  type: FileOrCreate
  mountPath: {{ $paths.rsdLockFile | quote }}
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
{{- if .Values.featureDiscovery.enabled }}
- name: nfd-features
  hostPath: {{ .Values.featureDiscovery.featuresDir | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.featureDiscovery.featuresDir | quote }}
  readOnly: false
{{- end }}
{{- if and .Values.logging.dir .Values.logging.hostPath }}
- name: log-dir
  hostPath: {{ .Values.logging.dir | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.logging.dir | quote }}
  readOnly: false
{{- end }}
{{- if eq .Values.resourceApi "dra" }}
- name: kubelet-plugins
  hostPath: {{ .Values.dra.kubeletPluginsPath | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.dra.kubeletPluginsPath | quote }}
  readOnly: false
- name: kubelet-plugins-registry
  hostPath: {{ .Values.dra.kubeletPluginRegistryPath | quote }}
  type: DirectoryOrCreate
  mountPath: {{ .Values.dra.kubeletPluginRegistryPath | quote }}
  readOnly: false
{{- end }}
- name: run-dir
  mountPath: {{ $paths.runDir | quote }}
  emptyDir: true
{{- end -}}

{{/*
Whether the pod gets a service account token: always with resourceApi dra (worker-dra calls the API
server), else automountServiceAccountToken (false by default: the device plugin never does).
*/}}
{{- define "rbln-device-plugin.automountToken" -}}
{{- if eq .Values.resourceApi "dra" -}}true{{- else -}}{{ .Values.automountServiceAccountToken }}{{- end -}}
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

{{/*
The metrics port (devicePlugin.containers.plugin.metricsPort); negative: the endpoint is off.
*/}}
{{- define "rbln-device-plugin.metricsPort" -}}
{{- int .Values.devicePlugin.containers.plugin.metricsPort -}}
{{- end -}}

{{/*
NFD_FEATURE_FILE: the file the scanner keeps in NFD's feature directory (featureDiscovery.enabled).
The name is the one Rebellions' NPU Feature Discovery writes, so only one of the two keeps it.
*/}}
{{- define "rbln-device-plugin.nfdFeatureFile" -}}
{{- printf "%s/rbln-features" (clean .Values.featureDiscovery.featuresDir) -}}
{{- end -}}
