{{/* Names and labels shared by every object of the chart. */}}

{{- define "kpssh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kpssh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kpssh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kpssh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kpssh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kpssh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kpssh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kpssh.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace of SSHHosts and their Secrets. */}}
{{- define "kpssh.poolNamespace" -}}
{{- default .Release.Namespace .Values.poolNamespace -}}
{{- end -}}

{{/* repository@digest when a digest is given (the Go chart's image.digest), else repository:tag. */}}
{{- define "kpssh.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The leader Lease's name (in the release namespace). */}}
{{- define "kpssh.leaseName" -}}
{{- default (printf "%s-controller" (include "kpssh.fullname" .)) .Values.leaderElection.id -}}
{{- end -}}

{{/*
The controller Deployments as a YAML list: `shards` as given, checked (names DNS labels and
unique, node classes non-empty and each owned by one shard only), or without shards one entry
with no name and no classes (a single controller for every node class).
*/}}
{{- define "kpssh.shards" -}}
{{- $shards := default list .Values.shards -}}
{{- if not $shards -}}
{{- list (dict "name" "") | toYaml -}}
{{- else -}}
{{- $owner := dict -}}
{{- $names := dict -}}
{{- range $i, $s := $shards -}}
{{- $name := toString (default "" $s.name) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?$" $name) -}}
{{- fail (printf "shards[%d].name %q must be a DNS label of at most 30 characters (it names the Deployment, the PodDisruptionBudget and the Lease)" $i $name) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "shards: two shards are named %q" $name) -}}
{{- end -}}
{{- $_ := set $names $name true -}}
{{- if not $s.nodeClasses -}}
{{- fail (printf "shards[%d] (%s): nodeClasses must name at least one SSHNodeClass" $i $name) -}}
{{- end -}}
{{- range $c := $s.nodeClasses -}}
{{- if hasKey $owner $c -}}
{{- fail (printf "shards: SSHNodeClass %q is in the nodeClasses of shard %s and of shard %s; each node class must belong to exactly one shard" $c (get $owner $c) $name) -}}
{{- end -}}
{{- $_ := set $owner $c $name -}}
{{- end -}}
{{- end -}}
{{- toYaml $shards -}}
{{- end -}}
{{- end -}}
