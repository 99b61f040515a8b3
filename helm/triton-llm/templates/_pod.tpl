{{/* The serving pod's template (metadata and spec), indented for a Deployment's spec.template; the
     LeaderWorkerSet indents it by 2. role: "server" (the Deployment's pods), "leader" / "worker" (a group's,
     gpu.multiGpuMode leader): the leader is the server that runs mpirun over the group, a worker runs the
     leader's ranks under an sshd. */}}
{{- define "triton-llm.podTemplate" -}}
{{- $role := .role -}}
{{- with .root -}}
{{- $root := . -}}
{{- $fullname := include "triton-llm.fullname" . -}}
{{- $gpus := include "triton-llm.gpuCount" . | int -}}
{{- $gpu := eq .Values.target "gpu" -}}
{{- $engineDir := include "triton-llm.engineDir" . -}}
{{- $readOnly := .Values.containerSecurityContext.readOnlyRootFilesystem -}}
{{- $startupBudget := int .Values.probes.startup.maxStartupSeconds -}}
{{- $ports := .Values.ports -}}
{{- /* tritonserver flags shared by both targets; the CPU launcher sets ports, metrics, model control,
       strict readiness and the model-repository/shared-memory restriction itself. */ -}}
{{- $common := list -}}
{{- if .Values.metrics.histogramLatencies -}}
{{- $common = append $common "--metrics-config=histogram_latencies=true" -}}
{{- end -}}
{{- if .Values.tracing.enabled -}}
{{- $common = append $common (printf "--trace-config=mode=%s" .Values.tracing.mode) -}}
{{- $common = append $common (printf "--trace-config=rate=%d" (int .Values.tracing.rate)) -}}
{{- $common = append $common (printf "--trace-config=level=%s" .Values.tracing.level) -}}
{{- if eq .Values.tracing.mode "opentelemetry" -}}
{{- $common = append $common (printf "--trace-config=opentelemetry,url=%s" .Values.tracing.otelUrl) -}}
{{- $common = append $common (printf "--trace-config=opentelemetry,resource=service.name=%s" .Values.tracing.serviceName) -}}
{{- $common = append $common (printf "--trace-config=opentelemetry,resource=k8s.namespace.name=%s" (include "triton-llm.namespace" .)) -}}
{{- else -}}
{{- $common = append $common "--trace-config=triton,file=/tmp/trace.json" -}}
{{- end -}}
{{- end -}}
    metadata:
      labels:
        {{- include "triton-llm.labels" . | nindent 8 }}
        {{- if and .Values.inferenceGateway.enabled (ne $role "worker") }}
        {{- include "triton-llm.poolLabel" . | nindent 8 }}
        llm-d.ai/engine-type: {{ .Values.inferenceGateway.engineType }}
        {{- end }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/scripts: {{ include (print $root.Template.BasePath "/configmap-scripts.yaml") . | sha256sum }}
        triton-llm/target: {{ .Values.target }}
        {{- if $gpu }}
        triton-llm/triton-release: {{ .Values.gpu.tritonRelease | quote }}
        {{- end }}
        {{- with .Values.commonAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "triton-llm.serviceAccountName" . }}
      automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ include "triton-llm.terminationGracePeriodSeconds" . }}
      {{- with .Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with .Values.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if or .Values.affinity (and $gpu .Values.gpu.products) }}
      affinity:
        {{- if and $gpu .Values.gpu.products }}
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: nvidia.com/gpu.product
                    operator: In
                    values:
                      {{- toYaml .Values.gpu.products | nindent 22 }}
        {{- end }}
        {{- with .Values.affinity }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- if or .Values.tolerations (and $gpu .Values.gpu.tolerateGpuTaint) }}
      tolerations:
        {{- if and $gpu .Values.gpu.tolerateGpuTaint }}
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
        {{- end }}
        {{- with .Values.tolerations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- if .Values.topologySpread.enabled }}
      topologySpreadConstraints:
        {{- range .Values.topologySpread.topologyKeys }}
        - maxSkew: {{ $root.Values.topologySpread.maxSkew }}
          topologyKey: {{ . }}
          whenUnsatisfiable: {{ $root.Values.topologySpread.whenUnsatisfiable }}
          labelSelector:
            matchLabels:
              {{- include "triton-llm.selectorLabels" $root | nindent 14 }}
          matchLabelKeys: [pod-template-hash]
        {{- end }}
      {{- end }}
      {{- if or (ne .Values.engine.source "image") .Values.engine.verify.enabled }}
      initContainers:
        {{- if eq .Values.engine.source "s3" }}
        - name: fetch-engine
          image: {{ include "triton-llm.s3Image" . }}
          imagePullPolicy: IfNotPresent
          command: ["/bin/sh", "/opt/triton-llm-chart/fetch_engine.sh"]
          env:
            - name: DEST_DIR
              value: {{ .Values.engine.mountPath | quote }}
            - name: S3_BUCKET
              value: {{ .Values.engine.s3.bucket | quote }}
            - name: S3_PREFIX
              value: {{ .Values.engine.s3.prefix | quote }}
            - name: S3_ENDPOINT
              value: {{ .Values.engine.s3.endpoint | quote }}
            - name: AWS_REGION
              value: {{ .Values.engine.s3.region | quote }}
            - name: CHECKSUM_FILE
              value: {{ .Values.engine.s3.checksumFile | quote }}
            - name: HOME
              value: /tmp
            {{- if .Values.engine.s3.existingSecret }}
            - name: AWS_ACCESS_KEY_ID
              valueFrom:
                secretKeyRef:
                  name: {{ .Values.engine.s3.existingSecret }}
                  key: AWS_ACCESS_KEY_ID
            - name: AWS_SECRET_ACCESS_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ .Values.engine.s3.existingSecret }}
                  key: AWS_SECRET_ACCESS_KEY
            {{- end }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          resources:
            limits:
              cpu: {{ .Values.initResources.cpu }}
              memory: {{ .Values.initResources.memory }}
            requests:
              cpu: {{ .Values.initResources.cpu }}
              memory: {{ .Values.initResources.memory }}
          volumeMounts:
            - name: engine
              mountPath: {{ .Values.engine.mountPath }}
            - name: scripts
              mountPath: /opt/triton-llm-chart
              readOnly: true
            - name: tmp
              mountPath: /tmp
        {{- end }}
        {{- if .Values.engine.verify.enabled }}
        - name: verify-engine
          image: {{ include "triton-llm.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command:
            - {{ .Values.tests.pythonCommand }}
            - /opt/triton-llm-chart/verify_engine.py
            - --engine-dir={{ $engineDir }}
            - --manifest={{ .Values.engine.verify.manifestFile }}
            {{- if $gpu }}
            - --expect-tp={{ .Values.gpu.tensorParallel }}
            - --expect-pp={{ .Values.gpu.pipelineParallel }}
            {{- end }}
            {{- with .Values.engine.verify.expectQuantAlgo }}
            - --expect-quant-algo={{ . }}
            {{- end }}
            {{- with .Values.engine.verify.expectComputeCapability }}
            - --expect-compute-capability={{ . }}
            {{- end }}
            {{- if .Values.engine.verify.files }}
            - --verify-files
            {{- end }}
            - --wait-seconds={{ .Values.engine.verify.waitSeconds }}
          env:
            - name: PYTHONDONTWRITEBYTECODE
              value: "1"
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          resources:
            limits:
              cpu: {{ .Values.initResources.cpu }}
              memory: {{ .Values.initResources.memory }}
            requests:
              cpu: {{ .Values.initResources.cpu }}
              memory: {{ .Values.initResources.memory }}
          volumeMounts:
            {{- if ne .Values.engine.source "image" }}
            - name: engine
              mountPath: {{ .Values.engine.mountPath }}
              {{- if and (eq .Values.engine.source "pvc") .Values.engine.pvc.subPath }}
              subPath: {{ .Values.engine.pvc.subPath }}
              {{- end }}
              readOnly: true
            {{- end }}
            - name: scripts
              mountPath: /opt/triton-llm-chart
              readOnly: true
        {{- end }}
      {{- end }}
      {{- /* Guaranteed QoS: limits and requests are the same map. */}}
      {{- $res := dict "cpu" .Values.resources.cpu "memory" .Values.resources.memory "ephemeral-storage" .Values.resources.ephemeralStorage }}
      {{- if gt $gpus 0 }}{{- $_ := set $res .Values.gpu.resourceName $gpus }}{{- end }}
      {{- with .Values.resources.hugepages2Mi }}{{- $_ := set $res "hugepages-2Mi" . }}{{- end }}
      {{- with .Values.resources.hugepages1Gi }}{{- $_ := set $res "hugepages-1Gi" . }}{{- end }}
      containers:
        {{- if eq $role "worker" }}
        {{- /* A group's worker: an sshd (builders/trtllm/multinode.py) under which the leader's mpirun starts this
               pod's ranks; it serves nothing else, so its probes only check that sshd accepts connections. */}}
        - name: triton
          image: {{ include "triton-llm.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command:
            {{- toYaml .Values.gpu.multiNode.workerCommand | nindent 12 }}
          env:
            - name: HF_HUB_OFFLINE
              value: "1"
            - name: TRANSFORMERS_OFFLINE
              value: "1"
            - name: NVIDIA_DRIVER_CAPABILITIES
              value: {{ .Values.gpu.driverCapabilities | quote }}
          ports:
            - name: ssh
              containerPort: 2222
              protocol: TCP
          readinessProbe:
            tcpSocket:
              port: ssh
            periodSeconds: 5
          livenessProbe:
            tcpSocket:
              port: ssh
            periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
            failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          resources:
            limits:
              {{- toYaml $res | nindent 14 }}
            requests:
              {{- toYaml $res | nindent 14 }}
          volumeMounts:
            {{- include "triton-llm.serverMounts" . | nindent 12 }}
            - name: group-ssh
              mountPath: /etc/triton-llm/ssh
              readOnly: true
        {{- else }}
        - name: triton
          image: {{ include "triton-llm.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          {{- /* The image's ENTRYPOINT stays (unless overridden): GPU `builders.trtllm serve` checks the engines
                 against the GPU it runs on, then runs the launcher's supervisor; CPU tini -> the launcher. Both
                 serve the generating liveness check on HEALTH_PORT and drain before tritonserver gets SIGTERM. Both take the repository, then `--` and extra tritonserver
                 flags; ports, exit timeout and the admin key come from the environment. `--no-openai`: the
                 OpenAI front door is the pod's second container here, not a child of this one. */}}
          {{- with .Values.server.command }}
          command:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- /* The entry points (serving.launcher) restrict these four themselves; other groups here. */}}
          {{- $more := without .Values.server.restrictedApis "model-repository" "shared-memory" "trace" "logging" }}
          args:
            - --model-repository={{ .Values.server.modelRepository }}
            - --health-deadline={{ .Values.probes.liveness.deadlineSeconds }}
            {{- if $gpu }}
            - --multi-gpu-mode={{ .Values.gpu.multiGpuMode }}
            {{- else }}
            - --exit-timeout-secs={{ .Values.drain.exitTimeoutSeconds }}
            - --log-verbose={{ .Values.server.logVerbose }}
            - --ready-timeout={{ $startupBudget }}
            {{- end }}
            - --no-openai
            - "--"
            - --metrics-interval-ms={{ .Values.metrics.intervalMs }}
            {{- if $gpu }}
            - --allow-gpu-metrics=true
            {{- if gt (int .Values.server.logVerbose) 0 }}
            - --log-verbose={{ .Values.server.logVerbose }}
            {{- end }}
            {{- end }}
            {{- with $more }}
            - --http-restricted-api={{ join "," . }}:admin-key=$(TRITON_ADMIN_KEY)
            - --grpc-restricted-protocol={{ join "," . }}:admin-key=$(TRITON_ADMIN_KEY)
            {{- end }}
            {{- range $common }}
            - {{ . }}
            {{- end }}
            {{- range .Values.server.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: TRITON_ADMIN_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ include "triton-llm.adminSecretName" . }}
                  key: {{ .Values.server.adminKey.secretKey }}
            - name: HTTP_PORT
              value: {{ $ports.http | quote }}
            - name: GRPC_PORT
              value: {{ $ports.grpc | quote }}
            - name: METRICS_PORT
              value: {{ $ports.metrics | quote }}
            - name: HEALTH_PORT
              value: {{ $ports.health | quote }}
            - name: EXIT_TIMEOUT_SECS
              value: {{ .Values.drain.exitTimeoutSeconds | quote }}
            {{- if eq $role "leader" }}
            - name: TRTLLM_GPUS_PER_HOST
              value: {{ $gpus | quote }}
            {{- end }}
            - name: HF_HUB_OFFLINE
              value: "1"
            - name: TRANSFORMERS_OFFLINE
              value: "1"
            {{- if $gpu }}
            - name: NVIDIA_DRIVER_CAPABILITIES
              value: {{ .Values.gpu.driverCapabilities | quote }}
            {{- if .Values.gpu.mps.enabled }}
            - name: CUDA_MPS_PIPE_DIRECTORY
              value: {{ .Values.gpu.mps.pipeDirectory | quote }}
            - name: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
              value: {{ .Values.gpu.mps.activeThreadPercentage | quote }}
            {{- end }}
            {{- else }}
            {{- /* Threads = the CPUs this container owns, not the node's. */}}
            - name: OMP_NUM_THREADS
              value: {{ .Values.resources.cpu | quote }}
            {{- end }}
            {{- if $readOnly }}
            - name: HOME
              value: /tmp/home
            - name: XDG_CACHE_HOME
              value: /tmp/cache
            - name: HF_HOME
              value: /tmp/cache/huggingface
            - name: PYTHONDONTWRITEBYTECODE
              value: "1"
            {{- end }}
            {{- with .Values.server.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $ports.http }}
              protocol: TCP
            - name: grpc
              containerPort: {{ $ports.grpc }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $ports.metrics }}
              protocol: TCP
            - name: health
              containerPort: {{ $ports.health }}
              protocol: TCP
          startupProbe:
            httpGet:
              path: /v2/health/ready
              port: http
            periodSeconds: {{ .Values.probes.startup.periodSeconds }}
            timeoutSeconds: {{ .Values.probes.startup.timeoutSeconds }}
            failureThreshold: {{ include "triton-llm.startupFailureThreshold" . }}
          readinessProbe:
            httpGet:
              path: /v2/health/ready
              port: http
            periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
            timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
            failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
            successThreshold: 1
          {{- /* Generates one token through the ensemble (serving/health.py): Triton's /v2/health/live stays 200
                 while a Python model is stopped or wedged, so only a check that generates restarts such a pod. */}}
          livenessProbe:
            httpGet:
              path: /health/generate
              port: health
            periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
            timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
            failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
          lifecycle:
            preStop:
              {{- if eq .Values.drain.preStopAction "sleep" }}
              sleep:
                seconds: {{ .Values.drain.preStopSleepSeconds }}
              {{- else }}
              exec:
                command: ["sleep", "{{ .Values.drain.preStopSleepSeconds }}"]
              {{- end }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          resources:
            limits:
              {{- toYaml $res | nindent 14 }}
            requests:
              {{- toYaml $res | nindent 14 }}
          volumeMounts:
            {{- include "triton-llm.serverMounts" . | nindent 12 }}
            {{- if ne $role "server" }}
            - name: group-ssh
              mountPath: /etc/triton-llm/ssh
              readOnly: true
            {{- end }}
        {{- end }}
        {{- if and .Values.openai.enabled (ne $role "worker") }}
        {{- $oa := .Values.openai }}
        {{- /* The OpenAI-compatible front door: an asyncio HTTP server talking to the Triton container over gRPC on
               localhost. Ready (/health) only while Triton's ensemble is ready and it is not draining; live
               (/health/live) while the process runs, so a Triton restart never restarts it. SIGTERM reaches both
               containers at once (after the same preStop sleep): the front door refuses new requests with 503 and
               finishes its open streams, which Triton's drain lets finish as accepted requests. */}}
        - name: openai
          image: {{ include "triton-llm.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command:
            - {{ $oa.python | default (include "triton-llm.projectPython" .) }}
            - -m
            - serving
            - openai
            - --triton=localhost:{{ $ports.grpc }}
            - --host=0.0.0.0
            - --port={{ $ports.openai }}
            - --drain-timeout={{ .Values.drain.exitTimeoutSeconds }}
            {{- with $oa.servedModelName }}
            - --served-model-name={{ . }}
            {{- end }}
            {{- if .Values.inferenceGateway.enabled }}
            - --engine-metrics-path={{ .Values.inferenceGateway.metricsPath }}
            {{- end }}
            {{- range $oa.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- if $oa.apiKey.enabled }}
            - name: LLM_API_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ include "triton-llm.openaiSecretName" . }}
                  key: {{ $oa.apiKey.existingSecretKey }}
            {{- end }}
            - name: PYTHONDONTWRITEBYTECODE
              value: "1"
            {{- if $readOnly }}
            - name: HOME
              value: /tmp/home
            {{- end }}
            {{- with $oa.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: openai
              containerPort: {{ $ports.openai }}
              protocol: TCP
          readinessProbe:
            httpGet:
              path: /health
              port: openai
            periodSeconds: {{ $oa.probes.readiness.periodSeconds }}
            timeoutSeconds: {{ $oa.probes.readiness.timeoutSeconds }}
            failureThreshold: {{ $oa.probes.readiness.failureThreshold }}
            successThreshold: 1
          livenessProbe:
            httpGet:
              path: /health/live
              port: openai
            periodSeconds: {{ $oa.probes.liveness.periodSeconds }}
            timeoutSeconds: {{ $oa.probes.liveness.timeoutSeconds }}
            failureThreshold: {{ $oa.probes.liveness.failureThreshold }}
          lifecycle:
            preStop:
              {{- if eq .Values.drain.preStopAction "sleep" }}
              sleep:
                seconds: {{ .Values.drain.preStopSleepSeconds }}
              {{- else }}
              exec:
                command: ["sleep", "{{ .Values.drain.preStopSleepSeconds }}"]
              {{- end }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          resources:
            limits:
              cpu: {{ $oa.resources.cpu }}
              memory: {{ $oa.resources.memory }}
            requests:
              cpu: {{ $oa.resources.cpu }}
              memory: {{ $oa.resources.memory }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
        {{- end }}
      volumes:
        {{- if ne $role "server" }}
        - name: group-ssh
          secret:
            secretName: {{ include "triton-llm.groupSshSecretName" . }}
            defaultMode: 0440
        {{- end }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ .Values.shm.sizeLimit }}
        - name: tmp
          emptyDir:
            sizeLimit: {{ .Values.tmp.sizeLimit }}
        - name: scripts
          configMap:
            name: {{ $fullname }}-scripts
            defaultMode: 0555
        {{- if eq .Values.engine.source "pvc" }}
        - name: engine
          persistentVolumeClaim:
            claimName: {{ default (printf "%s-engines" $fullname) .Values.engine.pvc.existingClaim }}
            readOnly: true
        {{- else if eq .Values.engine.source "s3" }}
        - name: engine
          emptyDir:
            sizeLimit: {{ .Values.engine.s3.sizeLimit }}
        {{- end }}
        {{- if .Values.resources.hugepages2Mi }}
        - name: hugepages-2mi
          emptyDir:
            medium: HugePages-2Mi
        {{- end }}
        {{- if .Values.resources.hugepages1Gi }}
        - name: hugepages-1gi
          emptyDir:
            medium: HugePages-1Gi
        {{- end }}
        {{- if and $gpu .Values.gpu.mps.enabled }}
        - name: mps-pipe
          hostPath:
            path: {{ .Values.gpu.mps.pipeDirectory }}
            type: Directory
        {{- end }}
        {{- range .Values.extraWritablePaths }}
        - name: {{ .name }}
          emptyDir:
            sizeLimit: {{ .sizeLimit }}
        {{- end }}
{{- end -}}
{{- end -}}

{{/* The server container's mounts (a group's workers run the same ranks, so they mount the same). */}}
{{- define "triton-llm.serverMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
{{- if ne .Values.engine.source "image" }}
- name: engine
  mountPath: {{ .Values.engine.mountPath }}
  {{- if and (eq .Values.engine.source "pvc") .Values.engine.pvc.subPath }}
  subPath: {{ .Values.engine.pvc.subPath }}
  {{- end }}
  readOnly: true
{{- end }}
{{- if .Values.resources.hugepages2Mi }}
- name: hugepages-2mi
  mountPath: /hugepages-2Mi
{{- end }}
{{- if .Values.resources.hugepages1Gi }}
- name: hugepages-1gi
  mountPath: /hugepages-1Gi
{{- end }}
{{- if and (eq .Values.target "gpu") .Values.gpu.mps.enabled }}
- name: mps-pipe
  mountPath: {{ .Values.gpu.mps.pipeDirectory }}
{{- end }}
{{- range .Values.extraWritablePaths }}
- name: {{ .name }}
  mountPath: {{ .mountPath }}
{{- end }}
{{- end -}}
