{{/*
Names and labels shared by the templates. Object names, labels and fields
follow the kustomize overlays under deploy/ one for one (tests/deploy/helm.rs renders
both with the same settings and compares them); what the chart adds on top are
the Helm labels (helm.sh/chart, app.kubernetes.io/instance, .../version,
.../managed-by), the instance label in selectors, and the optional values.
*/}}

{{/* The app name: "attacher-hub" unless nameOverride says otherwise. */}}
{{- define "attacher-hub.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every object name: fullnameOverride, else the release name when it
already contains the app name, else "<release>-<app>". Kept to 50 characters
so that the longest suffix ("-publish-secrets") still fits in 63.
*/}}
{{- define "attacher-hub.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "attacher-hub.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Prefix of the names of cluster-scoped objects (ClusterRoles, ClusterRoleBindings):
"<release namespace>:<fullname>". Two releases differ in namespace or name, so
they never share one (a release named attacher-hub in two namespaces included).
*/}}
{{- define "attacher-hub.clusterName" -}}
{{- printf "%s:%s" .Release.Namespace (include "attacher-hub.fullname" .) -}}
{{- end -}}

{{/* The ServiceAccount every attacher-hub pod runs as. */}}
{{- define "attacher-hub.serviceAccountName" -}}
{{- default (include "attacher-hub.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels Helm manages; on every object. */}}
{{- define "attacher-hub.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the shared objects (RBAC, monitoring): name and part-of. */}}
{{- define "attacher-hub.labels" -}}
app.kubernetes.io/name: {{ include "attacher-hub.name" . }}
app.kubernetes.io/part-of: {{ include "attacher-hub.name" . }}
{{ include "attacher-hub.helmLabels" . }}
{{- end -}}

{{/*
Selector of the attacher-hub pods of one component ("hub" or "node"):
name, component and the release.
*/}}
{{- define "attacher-hub.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attacher-hub.name" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* Selector of the sidecar shape's controller pods: the controller's name and the release. */}}
{{- define "attacher-hub.sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attacher-hub.sidecar.deploymentName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Name of the sidecar shape's controller Deployment. */}}
{{- define "attacher-hub.sidecar.deploymentName" -}}
{{- default (printf "%s-controller" (include "attacher-hub.fullname" .)) .Values.sidecar.deploymentName -}}
{{- end -}}

{{/* Name of the metrics Service of the selected shape. */}}
{{- define "attacher-hub.metricsServiceName" -}}
{{- if .Values.service.name -}}
{{- .Values.service.name -}}
{{- else if eq .Values.mode "daemonset" -}}
{{- printf "%s-node-metrics" (include "attacher-hub.fullname" .) -}}
{{- else -}}
{{- printf "%s-metrics" (include "attacher-hub.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The image reference: repository, then @digest if set, else :tag (default: appVersion). */}}
{{- define "attacher-hub.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The parts of the attacher-hub container that every shape shares, placed after
`name`, `image` and `args`: pull policy, environment (the shape's own
variables first), port. Called with (dict "root" $ "env" <list>).
*/}}
{{- define "attacher-hub.containerCommon" -}}
{{ with .root.Values.image.pullPolicy -}}
imagePullPolicy: {{ . }}
{{ end -}}
env:
  {{- with .env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  # Namespace of the per-driver Leases (the Role grants Leases in this
  # namespace only).
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  {{- with .root.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: http-metrics
    containerPort: {{ .root.Values.httpPort }}
{{- end -}}

{{/*
The flags every shape passes after its driver source: leader election (in
leaderElection.namespace when set) and the HTTP listener.
*/}}
{{- define "attacher-hub.commonArgs" -}}
- --leader-election
{{- with .Values.leaderElection.namespace }}
- --leader-election-namespace={{ . }}
{{- end }}
- --http-endpoint=:{{ .Values.httpPort }}
{{- end -}}

{{/*
Every namespace where the release's attacher-hub keeps Leases, as a JSON list
(release namespace first unless leaderElection.namespace replaces it): the
drivers' default namespace (also where the replicas' presence Leases live)
and, in the hub shape, the namespaces hub.drivers entries name in
leaderElection.namespace. The Lease Roles belong in each.
*/}}
{{- define "attacher-hub.leaseNamespaces" -}}
{{- $all := list (default .Release.Namespace .Values.leaderElection.namespace) }}
{{- if eq .Values.mode "hub" }}
{{- range .Values.hub.drivers }}
{{- if kindIs "map" .leaderElection }}
{{- with .leaderElection.namespace }}
{{- $all = append $all . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $all | uniq | toJson }}
{{- end -}}

{{/*
The attacher-hub container's securityContext: securityContext when set, else
the shape's own (called with (dict "root" $ "default" <yaml>)).
*/}}
{{- define "attacher-hub.containerSecurityContext" -}}
{{- if .root.Values.securityContext -}}
{{- toYaml .root.Values.securityContext -}}
{{- else -}}
{{- .default -}}
{{- end -}}
{{- end -}}

{{/*
The pods' topologySpreadConstraints (hub and sidecar shapes, when any), each
without a labelSelector given the shape's pod selector (called with (dict "root" $
"selector" <map>)).
*/}}
{{- define "attacher-hub.topologySpreadConstraints" -}}
{{- $out := list }}
{{- range .root.Values.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $.selector) }}
{{- end }}
{{- $out = append $out $c }}
{{- end -}}
topologySpreadConstraints:
  {{- toYaml $out | nindent 2 }}
{{- end -}}

{{/* Liveness: fails when a Lease this replica leads could not be renewed in time. */}}
{{- define "attacher-hub.livenessProbe" -}}
livenessProbe:
  httpGet:
    path: /healthz/leader-election
    port: http-metrics
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 3
{{- end -}}

{{/*
Container security context of the image's user 65532: no root, no
capabilities, no privilege escalation, read-only root filesystem (the process
writes no files), the runtime's default seccomp profile (also where the pod's
securityContext, which podSecurityContext may replace, sets none).
*/}}
{{- define "attacher-hub.nonRootSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Container security context of the daemonset shape: UID 0 to reach the node
plugins' root-owned sockets (mode 0755 normally; connecting to a Unix socket
needs write permission on it), with every capability dropped (so no
DAC_OVERRIDE), no privilege escalation, a read-only root filesystem and the
runtime's default seccomp profile.
*/}}
{{- define "attacher-hub.rootSecurityContext" -}}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Pod-level network, scheduling and pull settings shared by every shape (only those set). */}}
{{- define "attacher-hub.podExtras" -}}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod annotations, when any. */}}
{{- define "attacher-hub.podAnnotations" -}}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The attacher-hub container of the sidecar shape; external-attacher's
arguments, so it replaces that container of any driver's controller pod.
*/}}
{{- define "attacher-hub.sidecar.container" -}}
name: {{ .Values.sidecar.containerName }}
image: {{ include "attacher-hub.image" . }}
args:
  - --csi-address=$(ADDRESS)
  {{- include "attacher-hub.commonArgs" . | nindent 2 }}
  {{- with .Values.extraArgs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{ include "attacher-hub.containerCommon" (dict "root" . "env" (list (dict "name" "ADDRESS" "value" (printf "%s/%s" .Values.sidecar.socketDir .Values.sidecar.socketName)))) }}
{{ include "attacher-hub.livenessProbe" . }}
{{- with (default .Values.sidecar.resources .Values.resources) }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "attacher-hub.containerSecurityContext" (dict "root" . "default" (include "attacher-hub.nonRootSecurityContext" .)) | nindent 2 }}
volumeMounts:
  - name: socket-dir
    mountPath: {{ .Values.sidecar.socketDir }}
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
