{{/* Names, labels and the pieces every pod shares. */}}

{{- define "zenflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "zenflow.fullname" -}}
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

{{- define "zenflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "coordinator"). */}}
{{- define "zenflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zenflow.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* The standard labels of every object: (dict "ctx" $ "component" "worker"). */}}
{{- define "zenflow.labels" -}}
{{ include "zenflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Values.image.tag | default .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: zenflow
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "zenflow.chart" .ctx }}
{{- end -}}

{{- define "zenflow.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "zenflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "zenflow.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "zenflow.coordinatorName" -}}{{ include "zenflow.fullname" . }}-coordinator{{- end -}}
{{- define "zenflow.workerName" -}}{{ include "zenflow.fullname" . }}-worker{{- end -}}
{{- define "zenflow.optimizerName" -}}{{ include "zenflow.fullname" . }}-optimizer{{- end -}}

{{/* HOST:PORT workers, optimizer nodes and the CLI dial: the Service's cluster DNS name. */}}
{{- define "zenflow.coordinatorAddress" -}}
{{ include "zenflow.coordinatorName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.coordinator.port }}
{{- end -}}

{{- define "zenflow.tokensSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-tokens" (include "zenflow.fullname" .)) -}}
{{- end -}}

{{- define "zenflow.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-coordinator-tls" (include "zenflow.fullname" .)) -}}
{{- end -}}

{{- define "zenflow.sharedClaimName" -}}
{{- .Values.sharedVolume.existingClaim | default (printf "%s-shared" (include "zenflow.fullname" .)) -}}
{{- end -}}

{{/* Checks across values that the schema cannot express; each failure names the keys. */}}
{{- define "zenflow.validate" -}}
{{- if and (not .Values.tls.enabled) (not .Values.coordinator.insecurePlaintext) -}}
{{- fail "tls.enabled is false and coordinator.insecurePlaintext is false: the coordinator refuses plaintext gRPC off loopback; enable TLS or set coordinator.insecurePlaintext: true (only behind a network that encrypts)" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not .Values.tls.certManager.enabled) -}}
{{- fail "tls.enabled needs tls.existingSecret (a kubernetes.io/tls Secret with ca.crt) or tls.certManager.enabled" -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.tls.existingSecret .Values.tls.certManager.enabled -}}
{{- fail "tls.existingSecret and tls.certManager.enabled exclude each other: the Secret comes from one of them" -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name" -}}
{{- end -}}
{{- if and .Values.storage.s3.enabled .Values.storage.s3.roleArn (not .Values.serviceAccount.create) -}}
{{- fail "storage.s3.roleArn annotates the chart's service account, but serviceAccount.create is false: annotate yours with eks.amazonaws.com/role-arn instead" -}}
{{- end -}}
{{- end -}}

{{/* Token files, mounted read-only; key: "admin" or "worker" picks the one file a pod gets. */}}
{{- define "zenflow.tokenVolume" -}}
- name: tokens
  secret:
    secretName: {{ include "zenflow.tokensSecretName" .ctx }}
    defaultMode: 0440
    items:
      {{- if or (eq .key "admin") (eq .key "both") }}
      - key: {{ .ctx.Values.auth.adminTokenKey }}
        path: admin-token
      {{- end }}
      {{- if or (eq .key "worker") (eq .key "both") }}
      - key: {{ .ctx.Values.auth.workerTokenKey }}
        path: worker-token
      {{- end }}
{{- end -}}

{{/* The coordinator's CA only (never its key), for the pods that dial it over TLS (tls.enabled). */}}
{{- define "zenflow.tlsCaVolume" -}}
- name: tls-ca
  secret:
    secretName: {{ include "zenflow.tlsSecretName" . }}
    defaultMode: 0444
    items:
      - key: {{ .Values.tls.caKey }}
        path: ca.crt
{{- end -}}

{{- define "zenflow.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "zenflow.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* storage.s3: where the bucket is and the credentials, for the workers and the coordinator. */}}
{{- define "zenflow.s3Env" -}}
{{- $s := .Values.storage.s3 -}}
{{- if $s.enabled }}
{{- with $s.endpoint }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ . | quote }}
{{- end }}
{{- with $s.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "zenflow.s3EnvFrom" -}}
{{- $s := .Values.storage.s3 -}}
{{- if and $s.enabled $s.credentialsSecret }}
envFrom:
  - secretRef:
      name: {{ $s.credentialsSecret }}
{{- end }}
{{- end -}}
