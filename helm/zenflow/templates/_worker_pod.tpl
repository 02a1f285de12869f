{{/* The worker pod template, shared by the StatefulSet and the DaemonSet. */}}
{{- define "zenflow.workerPodTemplate" -}}
{{- $w := .Values.workers }}
{{- $o := $w.offload }}
{{- $slots := ternary (int $w.gpus) (int $w.cpuSlots) (gt (int $w.gpus) 0) }}
{{- $cores := mul $slots $o.physicalCoresPerSlot }}
{{- $offeredGiB := mul $slots $o.hostMemoryGiBPerSlot }}
{{- $memoryGiB := add $offeredGiB $o.memoryOverheadGiB $w.shmSizeGiB -}}
metadata:
  labels:
    {{- include "zenflow.labels" (dict "ctx" . "component" "worker") | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "zenflow.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    fsGroup: 10001
    fsGroupChangePolicy: OnRootMismatch
    seccompProfile:
      type: RuntimeDefault
  # SIGTERM: the agent stops its jobs, which checkpoint within stopGraceSeconds.
  terminationGracePeriodSeconds: {{ add $w.stopGraceSeconds 30 }}
  containers:
    - name: worker
      image: {{ include "zenflow.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: [zenflow-worker]
      args:
        - --coordinator={{ include "zenflow.coordinatorAddress" . }}
        - --token-file=/etc/zenflow/tokens/worker-token
        - --work-dir=/var/lib/zenflow/work
        - --name=$(ZENFLOW_WORKER_NAME)
        - --address=$(POD_IP)
        {{- if eq (int $w.gpus) 0 }}
        - --cpu-only
        - --cpu-slots={{ $w.cpuSlots }}
        {{- end }}
        - --host-memory-gb={{ $offeredGiB }}
        - --physical-cores={{ $cores }}
        - --stop-grace={{ $w.stopGraceSeconds }}
        - --metrics-port={{ $w.metricsPort }}
        - --metrics-host=0.0.0.0
        {{- if .Values.tls.enabled }}
        - --tls-ca=/etc/zenflow/tls/ca.crt
        {{- end }}
        {{- range $k, $v := $w.labels }}
        - --label={{ $k }}={{ $v }}
        {{- end }}
        {{- /* Job specs may name paths under these and the work dir only. */}}
        {{- if .Values.sharedVolume.enabled }}
        - --allowed-root={{ .Values.sharedVolume.mountPath }}
        {{- end }}
        {{- range $w.allowedRoots }}
        - --allowed-root={{ . }}
        {{- end }}
        {{- range $w.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: ZENFLOW_WORKER_NAME
          valueFrom:
            fieldRef:
              {{- if eq $w.kind "DaemonSet" }}
              fieldPath: spec.nodeName
              {{- else }}
              fieldPath: metadata.name
              {{- end }}
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        - name: HOME
          value: /tmp
        {{- include "zenflow.s3Env" . | nindent 8 }}
      {{- include "zenflow.s3EnvFrom" . | nindent 6 }}
      ports:
        - name: metrics
          containerPort: {{ $w.metricsPort }}
          protocol: TCP
      readinessProbe:
        httpGet:
          path: /healthz
          port: metrics
        periodSeconds: 10
      livenessProbe:
        httpGet:
          path: /healthz
          port: metrics
        periodSeconds: 20
        failureThreshold: 6
      resources:
        requests:
          cpu: {{ mul $cores $o.threadsPerCore | quote }}
          memory: {{ printf "%dGi" $memoryGiB }}
          {{- if gt (int $w.gpus) 0 }}
          nvidia.com/gpu: {{ $w.gpus }}
          {{- end }}
          {{- range $k, $v := $w.extraResources }}
          {{ $k }}: {{ $v | quote }}
          {{- end }}
        limits:
          cpu: {{ mul $cores $o.threadsPerCore | quote }}
          memory: {{ printf "%dGi" $memoryGiB }}
          {{- if gt (int $w.gpus) 0 }}
          nvidia.com/gpu: {{ $w.gpus }}
          {{- end }}
          {{- range $k, $v := $w.extraResources }}
          {{ $k }}: {{ $v | quote }}
          {{- end }}
      securityContext:
        {{- toYaml $w.securityContext | nindent 8 }}
      volumeMounts:
        - name: tokens
          mountPath: /etc/zenflow/tokens
          readOnly: true
        - name: work
          mountPath: /var/lib/zenflow/work
        - name: tmp
          mountPath: /tmp
        - name: dshm
          mountPath: /dev/shm
        {{- if .Values.tls.enabled }}
        - name: tls-ca
          mountPath: /etc/zenflow/tls
          readOnly: true
        {{- end }}
        {{- if .Values.sharedVolume.enabled }}
        - name: shared
          mountPath: {{ .Values.sharedVolume.mountPath }}
        {{- end }}
  volumes:
    {{- include "zenflow.tokenVolume" (dict "ctx" . "key" "worker") | nindent 4 }}
    {{- if .Values.tls.enabled }}{{- include "zenflow.tlsCaVolume" . | nindent 4 }}{{- end }}
    - name: work
      emptyDir: {}
    - name: tmp
      emptyDir: {}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ printf "%dGi" (int $w.shmSizeGiB) }}
    {{- if .Values.sharedVolume.enabled }}
    - name: shared
      persistentVolumeClaim:
        claimName: {{ include "zenflow.sharedClaimName" . }}
    {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
