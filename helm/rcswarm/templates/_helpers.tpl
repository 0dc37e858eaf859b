{{/*
Named templates of the rcswarm chart; every name starts with "rcswarm." so that a parent chart's
templates cannot collide with them.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "rcswarm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
"<release>-<chart>" (or the release alone when it already holds the chart's name, or fullnameOverride),
at most 40 characters: every object's name is this base plus a suffix, and the longest ones must
still fit: the StatefulSet "<base>-coordinator" within 52 (its pods' controller-revision-hash label,
"<name>-<10-character hash>", within 63) and the Service "<base>-coordinator-external" within 63.
Truncating the base rather than each suffixed name keeps the names distinct; a base over 40
characters keeps its first 33 and ends with 6 characters of its hash, so two long release names
sharing a prefix still get names of their own.
*/}}
{{- define "rcswarm.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- $full = .Release.Name -}}
{{- else -}}
{{- $full = printf "%s-%s" .Release.Name $name -}}
{{- end -}}
{{- end -}}
{{- $full = $full | trimSuffix "-" -}}
{{- if le (len $full) 40 -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" ($full | trunc 33 | trimSuffix "-") ($full | sha256sum | trunc 6) -}}
{{- end -}}
{{- end -}}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "rcswarm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select one component's pods: call with (dict "root" $ "component" "coordinator"). */}}
{{- define "rcswarm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rcswarm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of one component's objects: call with (dict "root" $ "component" "coordinator"). */}}
{{- define "rcswarm.labels" -}}
helm.sh/chart: {{ include "rcswarm.chart" .root }}
{{ include "rcswarm.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: rcswarm
{{- end -}}

{{/* Name of the coordinator's StatefulSet, its client Service, Ingress and ServiceMonitor (at most 52 characters). */}}
{{- define "rcswarm.coordinator.fullname" -}}
{{- printf "%s-coordinator" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the headless Service that governs the StatefulSet. */}}
{{- define "rcswarm.coordinator.headless" -}}
{{- printf "%s-coordinator-hl" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the Service that exposes the coordinator outside the cluster (coordinator.external). */}}
{{- define "rcswarm.coordinator.external" -}}
{{- printf "%s-coordinator-external" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the workers' Deployment. */}}
{{- define "rcswarm.worker.fullname" -}}
{{- printf "%s-worker" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the RayCluster (within 44 characters, below the 50 the chart has always kept it to). */}}
{{- define "rcswarm.ray.fullname" -}}
{{- printf "%s-ray" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the ConfigMap with the Grafana board. */}}
{{- define "rcswarm.grafanaDashboardName" -}}
{{- printf "%s-grafana-dashboard" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* HOST:PORT of the coordinator for in-cluster clients; a TLS certificate must name this host. */}}
{{- define "rcswarm.coordinator.address" -}}
{{- printf "%s.%s.svc:%d" (include "rcswarm.coordinator.fullname" .) .Release.Namespace (int .Values.coordinator.port) -}}
{{- end -}}

{{/* Name of the ConfigMap holding the RUN.toml. */}}
{{- define "rcswarm.configName" -}}
{{- printf "%s-run" (include "rcswarm.fullname" .) -}}
{{- end -}}

{{/* Name of the Secret holding the join token: auth.existingSecret, else the one the chart makes. */}}
{{- define "rcswarm.tokenSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-token" (include "rcswarm.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Key of the token inside that Secret. */}}
{{- define "rcswarm.tokenSecretKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* "true" when the dashboard takes read-only view tokens (coordinator.dashboard.viewTokenSecret), else empty. */}}
{{- define "rcswarm.viewTokenEnabled" -}}
{{- if and .Values.coordinator.dashboard.enabled .Values.coordinator.dashboard.viewTokenSecret -}}true{{- end -}}
{{- end -}}

{{/* Where the coordinator reads the view token Secret's key (--view-token-file), a volume of its own. */}}
{{- define "rcswarm.viewTokenFile" -}}
/etc/rcswarm/view-token/token
{{- end -}}

{{/* The container env entry carrying the join token, always from the Secret. */}}
{{- define "rcswarm.tokenEnv" -}}
- name: RCSWARM_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "rcswarm.tokenSecretName" . }}
      key: {{ include "rcswarm.tokenSecretKey" . }}
{{- end -}}

{{/* Env entries every rcswarm container gets: a writable HOME and caches on the /tmp emptyDir. */}}
{{- define "rcswarm.commonEnv" -}}
- name: HOME
  value: /tmp
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* "<repository>:<tag>": call with (dict "root" $ "tag" .Values.workers.image.tag "default" "cpu"). */}}
{{- define "rcswarm.image" -}}
{{- $tag := .tag | default (printf "%s-%s" .root.Chart.AppVersion .default) -}}
{{- printf "%s:%s" .root.Values.image.repository $tag -}}
{{- end -}}

{{/* Name of the Secret with the CA certificate that clients trust. */}}
{{- define "rcswarm.tls.caSecretName" -}}
{{- .Values.tls.caSecretName | default .Values.tls.secretName -}}
{{- end -}}

{{/* Mount paths of the TLS material inside the containers. */}}
{{- define "rcswarm.tls.serverDir" -}}/etc/rcswarm/tls{{- end -}}
{{- define "rcswarm.tls.caDir" -}}/etc/rcswarm/tls-ca{{- end -}}
{{- define "rcswarm.tls.clientDir" -}}/etc/rcswarm/tls-client{{- end -}}

{{/* Worker-side TLS arguments (--tls-ca, and the client certificate with mutual TLS), one per line. */}}
{{- define "rcswarm.tls.clientArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-ca
- {{ include "rcswarm.tls.caDir" . }}/{{ .Values.tls.caKey }}
{{- if .Values.tls.mutual.enabled }}
- --tls-cert
- {{ include "rcswarm.tls.clientDir" . }}/tls.crt
- --tls-key
- {{ include "rcswarm.tls.clientDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts of a client's TLS material. */}}
{{- define "rcswarm.tls.clientMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls-ca
  mountPath: {{ include "rcswarm.tls.caDir" . }}
  readOnly: true
{{- if .Values.tls.mutual.enabled }}
- name: tls-client
  mountPath: {{ include "rcswarm.tls.clientDir" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* Volumes of a client's TLS material. */}}
{{- define "rcswarm.tls.clientVolumes" -}}
{{- if .Values.tls.enabled }}
- name: tls-ca
  secret:
    secretName: {{ include "rcswarm.tls.caSecretName" . }}
    items:
      - key: {{ .Values.tls.caKey }}
        path: {{ .Values.tls.caKey }}
{{- if .Values.tls.mutual.enabled }}
- name: tls-client
  secret:
    secretName: {{ .Values.tls.mutual.clientSecretName }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Milliseconds of a Prometheus duration such as 500ms, 10s, 1m30s or 2h (the schema checks its form). */}}
{{- define "rcswarm.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $total := int64 0 -}}
{{- range (regexFindAll "[0-9]+(ms|[smhdwy])" (toString .) -1) -}}
{{- $number := regexFind "^[0-9]+" . -}}
{{- $total = add $total (mul (int64 $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Checks across values that a JSON schema cannot state clearly; each failure names the values and
what to do. Included by the coordinator's StatefulSet, which every release renders.
*/}}
{{- define "rcswarm.validate" -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName: a Secret of type kubernetes.io/tls holding the coordinator's certificate (tls.crt, tls.key)" -}}
{{- end -}}
{{- if and .Values.tls.mutual.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.mutual.enabled needs tls.enabled: client certificates are part of the TLS handshake" -}}
{{- end -}}
{{- if and .Values.tls.mutual.enabled (not .Values.tls.mutual.clientSecretName) -}}
{{- fail "tls.mutual.enabled needs tls.mutual.clientSecretName: the Secret with the in-cluster workers' client certificate" -}}
{{- end -}}
{{- if and .Values.tls.mutual.enabled .Values.coordinator.ingress.enabled -}}
{{- fail "tls.mutual.enabled and coordinator.ingress.enabled cannot be combined: the ingress controller terminates TLS, so an outside worker's client certificate never reaches the coordinator. Expose the coordinator with coordinator.external instead (a LoadBalancer or NodePort Service that passes TLS through to the coordinator), or set tls.mutual.enabled=false" -}}
{{- end -}}
{{- if and .Values.coordinator.external.enabled (not .Values.tls.enabled) -}}
{{- fail "coordinator.external.enabled exposes the coordinator outside the cluster: set tls.enabled=true and tls.secretName, or the join token and every update cross the network in plaintext" -}}
{{- end -}}
{{- if eq (int .Values.coordinator.port) (int .Values.coordinator.healthPort) -}}
{{- fail (printf "coordinator.healthPort %d equals coordinator.port: the plaintext health server needs its own port" (int .Values.coordinator.healthPort)) -}}
{{- end -}}
{{- if and .Values.coordinator.dashboard.enabled (eq (int .Values.coordinator.port) (int .Values.coordinator.dashboard.port)) -}}
{{- fail (printf "coordinator.dashboard.port %d equals coordinator.port: the dashboard needs its own port" (int .Values.coordinator.dashboard.port)) -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.coordinator.dashboard.enabled (eq (int .Values.coordinator.healthPort) (int .Values.coordinator.dashboard.port)) -}}
{{- fail (printf "coordinator.dashboard.port %d equals coordinator.healthPort: with tls.enabled the plaintext health server and the dashboard each need their own port" (int .Values.coordinator.dashboard.port)) -}}
{{- end -}}
{{- if and (include "rcswarm.viewTokenEnabled" .) (eq .Values.coordinator.dashboard.viewTokenSecret (include "rcswarm.tokenSecretName" .)) (eq .Values.coordinator.dashboard.viewTokenSecretKey (include "rcswarm.tokenSecretKey" .)) -}}
{{- fail "coordinator.dashboard.viewTokenSecret and viewTokenSecretKey name the join token itself: a view token must be one that cannot join the swarm; put a token of its own in another Secret or key" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.coordinator.dashboard.enabled) -}}
{{- fail "serviceMonitor.enabled scrapes the dashboard's /metrics: set coordinator.dashboard.enabled=true" -}}
{{- end -}}
{{- if .Values.serviceMonitor.enabled -}}
{{- $interval := include "rcswarm.durationMs" .Values.serviceMonitor.interval | int64 -}}
{{- $timeout := include "rcswarm.durationMs" .Values.serviceMonitor.scrapeTimeout | int64 -}}
{{- if gt $timeout $interval -}}
{{- fail (printf "serviceMonitor.scrapeTimeout %s is longer than serviceMonitor.interval %s: Prometheus refuses a scrape timeout above the scrape interval; lower the timeout or raise the interval" .Values.serviceMonitor.scrapeTimeout .Values.serviceMonitor.interval) -}}
{{- end -}}
{{- end -}}
{{- if gt (int .Values.ray.workerGroup.minReplicas) (int .Values.ray.workerGroup.maxReplicas) -}}
{{- fail (printf "ray.workerGroup.minReplicas %d is above ray.workerGroup.maxReplicas %d" (int .Values.ray.workerGroup.minReplicas) (int .Values.ray.workerGroup.maxReplicas)) -}}
{{- end -}}
{{- /* A worker actor's GPUs must be on one Ray worker pod (the head has none): Ray never places a larger one. */ -}}
{{- if and .Values.ray.enabled (gt (float64 .Values.ray.launch.gpusPerWorker) (float64 .Values.ray.workerGroup.gpus)) -}}
{{- fail (printf "ray.launch.gpusPerWorker %v is above ray.workerGroup.gpus %v: a worker actor's GPUs must all be on one Ray worker pod (the head has none), so Ray could never place it and no worker would start; lower ray.launch.gpusPerWorker or raise ray.workerGroup.gpus" .Values.ray.launch.gpusPerWorker .Values.ray.workerGroup.gpus) -}}
{{- end -}}
{{- /* A worker pod sees its workers.gpus GPUs as cuda:0 .. cuda:<gpus - 1>; `rcswarm worker` exits on another device. */ -}}
{{- $device := toString .Values.workers.device -}}
{{- if and .Values.workers.enabled (hasPrefix "cuda" $device) -}}
{{- $gpus := int .Values.workers.gpus -}}
{{- if eq $gpus 0 -}}
{{- fail (printf "workers.device %s needs workers.gpus > 0: a worker pod without a GPU has no CUDA device, and the worker would exit at its start; set workers.gpus, or workers.device auto or cpu" $device) -}}
{{- end -}}
{{- if and (hasPrefix "cuda:" $device) (ge (int (trimPrefix "cuda:" $device)) $gpus) -}}
{{- fail (printf "workers.device %s: a worker pod sees its workers.gpus %d GPUs as cuda:0 to cuda:%d, so the worker would exit at its start; name one of those, or cuda or auto" $device $gpus (sub $gpus 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The volume mounts of every Ray container: /dev/shm, /tmp and the TLS client files. */}}
{{- define "rcswarm.ray.mounts" -}}
- name: shm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
{{- with (include "rcswarm.tls.clientMounts" . | trim) }}
{{ . }}
{{- end }}
{{- end }}

{{/* Ray's object store lives in /dev/shm (a container's default is 64 MiB); its session, logs and HOME in /tmp. */}}
{{- define "rcswarm.ray.volumes" -}}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.ray.shmSize }}
- name: tmp
  emptyDir: {}
{{- with (include "rcswarm.tls.clientVolumes" . | trim) }}
{{ . }}
{{- end }}
{{- end }}
