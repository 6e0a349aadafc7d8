{{/* Names and labels shared by every template. */}}

{{- define "tessera.name" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.scheduler.name" -}}
{{- printf "%s-scheduler" (include "tessera.name" .) -}}
{{- end -}}

{{- define "tessera.agent.name" -}}
{{- printf "%s-node-agent" (include "tessera.name" .) -}}
{{- end -}}

{{- define "tessera.scheduler.serviceAccount" -}}
{{- default (include "tessera.scheduler.name" .) .Values.scheduler.serviceAccount.name -}}
{{- end -}}

{{- define "tessera.agent.serviceAccount" -}}
{{- default (include "tessera.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tessera.scheduler.selectorLabels" -}}
app.kubernetes.io/name: tessera-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessera.agent.selectorLabels" -}}
app.kubernetes.io/name: tessera-node-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessera.scheduler.labels" -}}
{{ include "tessera.labels" . }}
{{ include "tessera.scheduler.selectorLabels" . }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "tessera.agent.labels" -}}
{{ include "tessera.labels" . }}
{{ include "tessera.agent.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{/* The DRA-mode agent's DaemonSet selects its own pods apart from the device-plugin
agent's; both are component node-agent (the metrics Service selects that). */}}
{{- define "tessera.agent.dra.selectorLabels" -}}
app.kubernetes.io/name: tessera-node-agent-dra
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessera.agent.dra.labels" -}}
{{ include "tessera.labels" . }}
{{ include "tessera.agent.dra.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{/* tessera.image: registry/repository:tag or @digest. Argument: (dict "root" $ "image" .Values.x.image) */}}
{{- define "tessera.image" -}}
{{- $root := .root -}}
{{- $ref := printf "%s/%s" $root.Values.image.registry .image.repository | trimPrefix "/" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $ref .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (.image.tag | default $root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
tessera.resourceNames: the four resource names as a YAML map, from resourceNames when
set (all four, one domain) or from resourceDomain.
*/}}
{{- define "tessera.resourceNames" -}}
{{- $n := .Values.resourceNames | default dict -}}
{{- if $n -}}
{{- $domain := "" -}}
{{- range $k := list "gpu" "gpuMemory" "gpuMemoryPercent" "gpuCores" -}}
{{- $v := get $n $k -}}
{{- if not $v -}}{{- fail (printf "resourceNames.%s must be set when resourceNames is set" $k) -}}{{- end -}}
{{- if not (contains "/" $v) -}}{{- fail (printf "resourceNames.%s %q has no domain" $k $v) -}}{{- end -}}
{{- $d := first (splitList "/" $v) -}}
{{- if and $domain (ne $d $domain) -}}{{- fail (printf "resourceNames must share one domain: %q and %q" $domain $d) -}}{{- end -}}
{{- $domain = $d -}}
{{- end -}}
gpu: {{ $n.gpu }}
gpuMemory: {{ $n.gpuMemory }}
gpuMemoryPercent: {{ $n.gpuMemoryPercent }}
gpuCores: {{ $n.gpuCores }}
{{- else -}}
gpu: {{ .Values.resourceDomain }}/gpu
gpuMemory: {{ .Values.resourceDomain }}/gpu-memory
gpuMemoryPercent: {{ .Values.resourceDomain }}/gpu-memory-percent
gpuCores: {{ .Values.resourceDomain }}/gpu-cores
{{- end -}}
{{- end -}}

{{/* tessera.resourceGroup: the domain of the resource names. */}}
{{- define "tessera.resourceGroup" -}}
{{- $names := include "tessera.resourceNames" . | fromYaml -}}
{{- first (splitList "/" $names.gpu) -}}
{{- end -}}

{{/* tessera.quotedResourceNames: the four resource names, quoted, comma-separated. */}}
{{- define "tessera.quotedResourceNames" -}}
{{- $names := include "tessera.resourceNames" . | fromYaml -}}
{{- range $i, $k := list "gpu" "gpuMemory" "gpuMemoryPercent" "gpuCores" }}{{ if $i }}, {{ end }}"{{ get $names $k }}"{{ end -}}
{{- end -}}

{{/*
tessera.mutatingPolicyAPI: the apiVersion of MutatingAdmissionPolicy the cluster serves,
or nothing. GA (admissionregistration.k8s.io/v1) and on by default from Kubernetes 1.36;
beta (v1beta1) in 1.34 and 1.35, served only where the API server turns it on
(--feature-gates=MutatingAdmissionPolicy=true and
--runtime-config=admissionregistration.k8s.io/v1beta1=true). The cluster's discovery
decides when there is one (helm install, upgrade, template --validate, or template
--api-versions). Without one, .Capabilities lists no kinds (not even
ValidatingAdmissionPolicy, GA since 1.30), and the server's minor decides: v1 from
1.36, none before.
*/}}
{{- define "tessera.mutatingPolicyAPI" -}}
{{- $v := .Capabilities.APIVersions -}}
{{- if $v.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1
{{- else if $v.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1beta1
{{- else if and (not ($v.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")) (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
admissionregistration.k8s.io/v1
{{- end -}}
{{- end -}}

{{/*
tessera.scheduler.image: the scheduler image of the cluster's Kubernetes minor. Each
minor Tessera supports has its scheduler build (build/k8s-minors): the newest, 1.37,
under the plain tag, each older one under the tag with -k8s<major>.<minor> appended.
scheduler.image.perKubeMinor=false or a digest takes the image as given.
*/}}
{{- define "tessera.scheduler.image" -}}
{{- $img := .Values.scheduler.image -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- $minor := printf "%d.%d" $v.Major $v.Minor -}}
{{- if and $img.perKubeMinor (not $img.digest) (ne $minor "1.37") -}}
{{- $tag := printf "%s-k8s%s" ($img.tag | default .Values.image.tag | default .Chart.AppVersion) $minor -}}
{{- $img = merge (dict "tag" $tag) $img -}}
{{- end -}}
{{- include "tessera.image" (dict "root" . "image" $img) -}}
{{- end -}}
