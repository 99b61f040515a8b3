{{/* vim: set filetype=mustache: */}}
{{/*
Names, labels and the arithmetic every template shares. Nothing here renders an object.
*/}}

{{- define "triton-llm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: the release name, plus the chart name unless the release name already has it. */}}
{{- define "triton-llm.fullname" -}}
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

{{- define "triton-llm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-llm.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-llm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-llm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The pods that serve: every pod, or a LeaderWorkerSet group's leaders only (its workers only run ranks). */}}
{{- define "triton-llm.servingSelectorLabels" -}}
{{ include "triton-llm.selectorLabels" . }}
{{- if include "triton-llm.leaderWorkerSet" . }}
leaderworkerset.sigs.k8s.io/worker-index: "0"
{{- end }}
{{- end -}}

{{- define "triton-llm.labels" -}}
{{ include "triton-llm.selectorLabels" . }}
helm.sh/chart: {{ include "triton-llm.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: triton-llm
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The InferencePool's name, and the label its selector matches (inferenceGateway.poolLabel). */}}
{{- define "triton-llm.poolName" -}}
{{- default (include "triton-llm.fullname" .) .Values.inferenceGateway.inferencePool.name -}}
{{- end -}}

{{- define "triton-llm.poolLabel" -}}
{{ .Values.inferenceGateway.poolLabel.key }}: {{ default (include "triton-llm.fullname" .) .Values.inferenceGateway.poolLabel.value | quote }}
{{- end -}}

{{/* Label that lets a pod through the NetworkPolicy when allowSameNamespace is off (the helm test pods carry it). */}}
{{- define "triton-llm.clientLabel" -}}
{{- printf "%s-client" (include "triton-llm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-llm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "triton-llm.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* registry/repository:tag or @digest. Argument: dict with image (registry, repository, tag, digest) and default tag. */}}
{{- define "triton-llm.imageRef" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- if $img.registry -}}{{- $repo = printf "%s/%s" $img.registry $img.repository -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .defaultTag $img.tag | toString) -}}
{{- end -}}
{{- end -}}

{{- define "triton-llm.image" -}}
{{- include "triton-llm.imageRef" (dict "image" .Values.image "defaultTag" .Chart.AppVersion) -}}
{{- end -}}

{{- define "triton-llm.s3Image" -}}
{{- include "triton-llm.imageRef" (dict "image" .Values.engine.s3.image "defaultTag" "latest") -}}
{{- end -}}

{{- define "triton-llm.adminSecretName" -}}
{{- default (printf "%s-admin-key" (include "triton-llm.fullname" .)) .Values.server.adminKey.existingSecret -}}
{{- end -}}

{{- define "triton-llm.openaiSecretName" -}}
{{- default (printf "%s-openai-api-key" (include "triton-llm.fullname" .)) .Values.openai.apiKey.existingSecret -}}
{{- end -}}

{{/* The image's Python for `-m serving openai` and the project's client: python on CPU, the tool venv on GPU. */}}
{{/* The front door answers /metrics only with an API key when keys are on: Prometheus sends the chart's secret. */}}
{{- define "triton-llm.openaiScrapeAuth" -}}
{{- if .Values.openai.apiKey.enabled -}}
authorization:
  type: Bearer
  credentials:
    name: {{ include "triton-llm.openaiSecretName" . }}
    key: {{ .Values.openai.apiKey.existingSecretKey }}
{{- end -}}
{{- end -}}

{{- define "triton-llm.projectPython" -}}
{{- ternary "/opt/venv/bin/python" "python" (eq .Values.target "gpu") -}}
{{- end -}}

{{/* GPUs per pod: tensor parallel x pipeline parallel on the GPU target (divided over the group's pods under
     multiGpuMode leader), none on the CPU target. */}}
{{- define "triton-llm.gpuCount" -}}
{{- if eq .Values.target "gpu" -}}
{{- div (mul (int .Values.gpu.tensorParallel) (int .Values.gpu.pipelineParallel)) (include "triton-llm.groupSize" . | int) -}}
{{- else -}}
0
{{- end -}}
{{- end -}}

{{/* "true" when the replicas are LeaderWorkerSet groups (gpu.multiGpuMode leader on the GPU target), else empty. */}}
{{- define "triton-llm.leaderWorkerSet" -}}
{{- if and (eq .Values.target "gpu") (eq .Values.gpu.multiGpuMode "leader") -}}true{{- end -}}
{{- end -}}

{{/* Pods per replica: TP x PP / gpu.multiNode.gpusPerNode under multiGpuMode leader (at least 1), else 1. */}}
{{- define "triton-llm.groupSize" -}}
{{- $world := mul (int .Values.gpu.tensorParallel) (int .Values.gpu.pipelineParallel) -}}
{{- $perNode := int .Values.gpu.multiNode.gpusPerNode -}}
{{- if and (include "triton-llm.leaderWorkerSet" .) (gt $world $perNode) -}}
{{- if ne (mod $world $perNode) 0 -}}
{{- fail (printf "\n\ngpu.tensorParallel x gpu.pipelineParallel (%d) is not a multiple of gpu.multiNode.gpusPerNode (%d): a\nLeaderWorkerSet group's pods each take gpusPerNode GPUs, so the ranks must fill them exactly." $world $perNode) -}}
{{- end -}}
{{- div $world $perNode -}}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{- define "triton-llm.groupSshSecretName" -}}
{{- default (printf "%s-group-ssh" (include "triton-llm.fullname" .)) .Values.gpu.multiNode.sshKey.existingSecret -}}
{{- end -}}

{{/* Engine directory: mountPath/subPath. */}}
{{- define "triton-llm.engineDir" -}}
{{- if .Values.engine.subPath -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.engine.mountPath) (trimPrefix "/" .Values.engine.subPath) -}}
{{- else -}}
{{- .Values.engine.mountPath -}}
{{- end -}}
{{- end -}}

{{/* Seconds between SIGTERM-to-be and SIGKILL: preStop sleep + Triton's exit timeout + margin for unloading. */}}
{{- define "triton-llm.terminationGracePeriodSeconds" -}}
{{- add .Values.drain.preStopSleepSeconds .Values.drain.exitTimeoutSeconds .Values.drain.marginSeconds -}}
{{- end -}}

{{/* ceil(maxStartupSeconds / periodSeconds) */}}
{{- define "triton-llm.startupFailureThreshold" -}}
{{- $p := int .Values.probes.startup.periodSeconds -}}
{{- div (add (int .Values.probes.startup.maxStartupSeconds) (sub $p 1)) $p -}}
{{- end -}}

{{/*
A Kubernetes quantity ("2Gi", "512Mi", "1.5G", "1048576") in MiB, as a decimal string.
The schema only lets these forms through; anything else fails here with the value in the message.
*/}}
{{- define "triton-llm.quantityToMi" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $bytes := dict "" 1.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- if or (not $num) (not (hasKey $bytes $suffix)) -}}
{{- fail (printf "%q is not a memory quantity this chart understands (use e.g. 512Mi, 2Gi, 1.5G)" $q) -}}
{{- end -}}
{{- divf (mulf (float64 $num) (get $bytes $suffix)) 1048576.0 -}}
{{- end -}}

{{/* PromQL label matchers selecting this release's pods (Prometheus Operator adds namespace and pod). */}}
{{- define "triton-llm.promSelector" -}}
{{- if .Values.metrics.selector -}}
{{- .Values.metrics.selector -}}
{{- else -}}
{{- printf "namespace=\"%s\",pod=~\"%s-[a-z0-9]{5,10}-[a-z0-9]{5}\"" (include "triton-llm.namespace" .) (include "triton-llm.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "triton-llm.dcgmSelector" -}}
{{- if .Values.metrics.dcgmSelector -}}
{{- .Values.metrics.dcgmSelector -}}
{{- else -}}
{{- include "triton-llm.promSelector" . -}}
{{- end -}}
{{- end -}}

{{/*
Every PromQL expression of the chart, in one place, as YAML (use with fromYaml). KEDA triggers, recording
rules, alerts and dashboard panels are all built from these, and every aggregate is a sum() (or max()),
so a query returns one series however many replicas there are.
*/}}
{{- define "triton-llm.queries" -}}
{{- $n := .Values.metrics.names -}}
{{- $s := include "triton-llm.promSelector" . -}}
{{- $llm := printf "%s,model=\"%s\"" $s .Values.metrics.models.llm -}}
{{- $ens := printf "%s,model=\"%s\"" $s .Values.metrics.models.ensemble -}}
{{- $gpu := eq .Values.target "gpu" -}}
{{- /* No query reads Triton's queue of the llm model (nv_inference_pending_request_count, nv_inference_queue_duration_us):
the llm model is decoupled on both targets, its execute() only enqueues, so that queue is always empty (issue 20). */}}
{{- if $gpu }}
{{- /* TensorRT-LLM's C++ backend (triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc):
scheduled = requests in this iteration's batch, fraction = used / max KV blocks (model_instance_state.cc WaitForStats).
Its waiting (= active - scheduled) counts only what the KV cache holds back in the slots, not the executor's queue
beyond them, which it does not export; the backlog is our llm's own gauge on both targets (requests accepted without a
first token: the executor's queue and those in their context phase). */}}
engineQueued: {{ printf "sum(%s{%s})" $n.engineQueued $s | squote }}
activeSlots: {{ printf "sum(%s{%s,request_type=\"scheduled\"})" $n.trtllmRequests $s | squote }}
kvCacheOccupancy: {{ printf "avg(%s{%s,kv_cache_block_type=\"fraction\"})" $n.trtllmKvCacheBlocks $s | squote }}
{{- else }}
engineQueued: {{ printf "sum(%s{%s})" $n.engineQueued $s | squote }}
activeSlots: {{ printf "sum(%s{%s})" $n.engineActiveSlots $s | squote }}
kvCacheOccupancy: {{ printf "avg(%s{%s})" $n.kvCacheOccupancy $s | squote }}
{{- end }}
{{- if and $gpu .Values.metrics.histogramLatencies }}
ttftMean1m: {{ printf "sum(rate(%s_sum{%s}[1m])) / clamp_min(sum(rate(%s_count{%s}[1m])), 1e-9) / 1000" $n.firstResponseHistogram $ens $n.firstResponseHistogram $ens | squote }}
{{- else if not $gpu }}
ttftMean1m: {{ printf "sum(rate(%s_sum{%s}[1m])) / clamp_min(sum(rate(%s_count{%s}[1m])), 1e-9)" $n.ttft $s $n.ttft $s | squote }}
{{- end }}
{{- if and $gpu .Values.metrics.histogramLatencies }}
ttftP50: {{ printf "histogram_quantile(0.5, sum by (le) (rate(%s_bucket{%s}[5m]))) / 1000" $n.firstResponseHistogram $ens | squote }}
ttftP99: {{ printf "histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s}[5m]))) / 1000" $n.firstResponseHistogram $ens | squote }}
{{- else if not $gpu }}
ttftP50: {{ printf "histogram_quantile(0.5, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.ttft $s | squote }}
ttftP99: {{ printf "histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.ttft $s | squote }}
tpotP50: {{ printf "histogram_quantile(0.5, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.tpot $s | squote }}
tpotP99: {{ printf "histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.tpot $s | squote }}
latencyP50: {{ printf "histogram_quantile(0.5, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.e2eLatency $s | squote }}
latencyP99: {{ printf "histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s}[5m])))" $n.e2eLatency $s | squote }}
generationTokensPerSecond: {{ printf "sum(rate(%s{%s}[2m]))" $n.generationTokens $s | squote }}
promptTokensPerSecond: {{ printf "sum(rate(%s{%s}[2m]))" $n.promptTokens $s | squote }}
{{- end }}
requestsPerSecond: {{ printf "sum(rate(%s{%s}[2m]))" $n.requestSuccess $ens | squote }}
failuresPerSecond: {{ printf "sum(rate(%s{%s}[2m]))" $n.requestFailure $ens | squote }}
errorRatio: {{ printf "sum(rate(%s{%s}[5m])) / clamp_min(sum(rate(%s{%s}[5m])) + sum(rate(%s{%s}[5m])), 1e-9)" $n.requestFailure $ens $n.requestSuccess $ens $n.requestFailure $ens | squote }}
executionsPerSecond: {{ printf "sum(rate(%s{%s}[2m]))" $n.execCount $llm | squote }}
cpuUtilization: {{ printf "avg(%s{%s})" $n.cpuUtilization $s | squote }}
podRestarts30m: {{ printf "max by (pod) (increase(%s{%s}[30m]))" $n.podRestarts $s | squote }}
{{- if $gpu }}
gpuUtilization: {{ printf "avg(%s{%s})" $n.gpuUtilization $s | squote }}
gpuMemoryUsedBytes: {{ printf "sum(%s{%s})" $n.gpuMemoryUsed $s | squote }}
dcgmGpuUtil: {{ printf "avg(%s{%s})" $n.dcgmGpuUtil (include "triton-llm.dcgmSelector" .) | squote }}
dcgmFbUsedMiB: {{ printf "sum(%s{%s})" $n.dcgmFbUsed (include "triton-llm.dcgmSelector" .) | squote }}
{{- end }}
{{- end -}}

{{/* Recording-rule name of a query: triton_llm:<snake_case>, one per release (labelled by namespace/release). */}}
{{- define "triton-llm.recordName" -}}
{{- printf "triton_llm:%s" (snakecase .) -}}
{{- end -}}

{{/*
Render-time checks that a schema cannot express. Each failure says what is wrong and what to change.
*/}}
{{- define "triton-llm.validate" -}}
{{- $v := .Values -}}
{{- if and $v.inferenceGateway.enabled (not $v.openai.enabled) -}}
{{- fail "\n\ninferenceGateway.enabled needs openai.enabled: the InferencePool routes to the front door's port, where the endpoint\npicker also reads the engine gauges (inferenceGateway.metricsPath)." -}}
{{- end -}}
{{- $memMi := include "triton-llm.quantityToMi" $v.resources.memory | float64 -}}
{{- $shmMi := include "triton-llm.quantityToMi" $v.shm.sizeLimit | float64 -}}
{{- if ge $shmMi $memMi -}}
{{- $msg := printf "\n\nshm.sizeLimit (%s = %.0f MiB) does not fit resources.memory (%s = %.0f MiB).\n/dev/shm is a memory-backed emptyDir: every byte written to it is charged to the pod's memory limit, so it\nmust leave room for tritonserver itself. Raise resources.memory or lower shm.sizeLimit." $v.shm.sizeLimit $shmMi $v.resources.memory $memMi -}}
{{- fail $msg -}}
{{- end -}}
{{- $perMi := include "triton-llm.quantityToMi" $v.shm.perPythonInstance | float64 -}}
{{- $needMi := mulf $perMi (float64 $v.shm.pythonBackendInstances) -}}
{{- if lt $shmMi $needMi -}}
{{- $msg := printf "\n\nshm.sizeLimit (%s = %.0f MiB) is below shm.pythonBackendInstances x shm.perPythonInstance (%d x %s = %.0f MiB):\nPython-backend models would die with bus errors. Raise shm.sizeLimit (and resources.memory with it)." $v.shm.sizeLimit $shmMi (int $v.shm.pythonBackendInstances) $v.shm.perPythonInstance $needMi -}}
{{- fail $msg -}}
{{- end -}}
{{- $diskMi := include "triton-llm.quantityToMi" $v.tmp.sizeLimit | float64 -}}
{{- $diskWhat := list (printf "/tmp %s" $v.tmp.sizeLimit) -}}
{{- if eq $v.engine.source "s3" -}}
{{- $diskMi = addf $diskMi (include "triton-llm.quantityToMi" $v.engine.s3.sizeLimit | float64) -}}
{{- $diskWhat = append $diskWhat (printf "engine download %s" $v.engine.s3.sizeLimit) -}}
{{- end -}}
{{- range $v.extraWritablePaths -}}
{{- $diskMi = addf $diskMi (include "triton-llm.quantityToMi" .sizeLimit | float64) -}}
{{- $diskWhat = append $diskWhat (printf "%s %s" .mountPath .sizeLimit) -}}
{{- end -}}
{{- $ephMi := include "triton-llm.quantityToMi" $v.resources.ephemeralStorage | float64 -}}
{{- if gt $diskMi $ephMi -}}
{{- $msg := printf "\n\nThe disk emptyDirs (%s = %.0f MiB) exceed resources.ephemeralStorage (%s = %.0f MiB):\nthe kubelet would evict the pod when they fill. Raise resources.ephemeralStorage or lower the sizeLimits." (join ", " $diskWhat) $diskMi $v.resources.ephemeralStorage $ephMi -}}
{{- fail $msg -}}
{{- end -}}
{{- if and (eq $v.engine.source "pvc") (not $v.engine.pvc.existingClaim) (not $v.engine.pvc.create) -}}
{{- $msg := "\n\nengine.source=pvc needs engine.pvc.existingClaim (a PVC with prebuilt engines) or engine.pvc.create=true." -}}
{{- fail $msg -}}
{{- end -}}
{{- if and (eq $v.engine.source "s3") (not $v.engine.s3.bucket) -}}
{{- $msg := "\n\nengine.source=s3 needs engine.s3.bucket (and engine.s3.prefix of the engine directory)." -}}
{{- fail $msg -}}
{{- end -}}
{{- if $v.engineBuild.enabled -}}
{{- if ne $v.target "gpu" -}}
{{- $msg := "\n\nengineBuild.enabled builds a TensorRT-LLM engine: it needs target=gpu (the CPU engine is built into the CPU image)." -}}
{{- fail $msg -}}
{{- end -}}
{{- if ne $v.engine.source "pvc" -}}
{{- $msg := "\n\nengineBuild.enabled writes the engine into the engine PVC: set engine.source=pvc (with engine.pvc.existingClaim or engine.pvc.create)." -}}
{{- fail $msg -}}
{{- end -}}
{{- if not $v.engineBuild.checkpoint.existingClaim -}}
{{- $msg := "\n\nengineBuild.enabled needs engineBuild.checkpoint.existingClaim: the PVC holding the Hugging Face checkpoint." -}}
{{- fail $msg -}}
{{- end -}}
{{- end -}}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- $msg := printf "\n\nautoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)." (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- fail $msg -}}
{{- end -}}
{{- if eq $v.autoscaling.mode "keda" -}}
{{- $t := $v.autoscaling.keda.triggers -}}
{{- $queue := $t.engineQueue.enabled -}}
{{- if not (or $queue $t.activeSlots.enabled $t.kvCacheOccupancy.enabled $t.ttft.enabled) -}}
{{- $msg := "\n\nautoscaling.mode=keda renders no trigger: enable at least one of autoscaling.keda.triggers.*." -}}
{{- fail $msg -}}
{{- end -}}
{{- if not (or $queue $t.activeSlots.enabled) -}}
{{- $msg := "\n\nautoscaling.keda: the fallback needs at least one AverageValue trigger (engineQueue or activeSlots);\nKEDA rejects a ScaledObject whose only triggers are metricType Value (kvCacheOccupancy, ttft) when a fallback is set." -}}
{{- fail $msg -}}
{{- end -}}
{{- if and $t.ttft.enabled (eq $v.target "gpu") (not $v.metrics.histogramLatencies) -}}
{{- $msg := "\n\nautoscaling.keda.triggers.ttft on GPU reads Triton's first-response histogram: set metrics.histogramLatencies=true." -}}
{{- fail $msg -}}
{{- end -}}
{{- $fb := int $v.autoscaling.keda.fallback.replicas -}}
{{- if or (lt $fb (int $v.autoscaling.minReplicas)) (gt $fb (int $v.autoscaling.maxReplicas)) -}}
{{- $msg := printf "\n\nautoscaling.keda.fallback.replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)." $fb (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- fail $msg -}}
{{- end -}}
{{- end -}}
{{- if eq (toString $v.pdb.minAvailable) (toString $v.pdb.maxUnavailable) -}}
{{- if eq (toString $v.pdb.minAvailable) "" -}}
{{- $msg := "\n\npdb: set exactly one of pdb.minAvailable and pdb.maxUnavailable." -}}
{{- fail $msg -}}
{{- end -}}
{{- end -}}
{{- if and (ne (toString $v.pdb.minAvailable) "") (ne (toString $v.pdb.maxUnavailable) "") -}}
{{- $msg := "\n\npdb: set exactly one of pdb.minAvailable and pdb.maxUnavailable (the other one empty)." -}}
{{- fail $msg -}}
{{- end -}}
{{- if and (eq $v.drain.preStopAction "sleep") (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) -}}
{{- $msg := printf "\n\ndrain.preStopAction=sleep needs Kubernetes >= 1.30 (the kubelet's sleep action); this cluster is %s: use drain.preStopAction=exec." .Capabilities.KubeVersion.Version -}}
{{- fail $msg -}}
{{- end -}}
{{- if le (float64 $v.probes.liveness.timeoutSeconds) (float64 $v.probes.liveness.deadlineSeconds) -}}
{{- $msg := printf "\n\nprobes.liveness.timeoutSeconds (%v) must exceed probes.liveness.deadlineSeconds (%v): the check answers 503 itself when\nits token is late, and the kubelet must wait for that answer. Raise timeoutSeconds or lower deadlineSeconds." $v.probes.liveness.timeoutSeconds $v.probes.liveness.deadlineSeconds -}}
{{- fail $msg -}}
{{- end -}}
{{- if eq $v.updateStrategy.type "RollingUpdate" -}}
{{- $ru := $v.updateStrategy.rollingUpdate -}}
{{- if and (eq (toString $ru.maxSurge) "0") (eq (toString $ru.maxUnavailable) "0") -}}
{{- $msg := "\n\nupdateStrategy.rollingUpdate: maxSurge and maxUnavailable cannot both be 0 (a rollout could never start)." -}}
{{- fail $msg -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* HPA behavior (also used by KEDA's HPA): quick but bounded scale-up, slow scale-down. */}}
{{- define "triton-llm.scalingBehavior" -}}
{{- $a := .Values.autoscaling -}}
scaleUp:
  stabilizationWindowSeconds: {{ $a.scaleUp.stabilizationWindowSeconds }}
  selectPolicy: Max
  policies:
    - type: Pods
      value: {{ $a.scaleUp.pods }}
      periodSeconds: {{ $a.scaleUp.periodSeconds }}
scaleDown:
  stabilizationWindowSeconds: {{ $a.scaleDown.stabilizationWindowSeconds }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: {{ $a.scaleDown.pods }}
      periodSeconds: {{ $a.scaleDown.periodSeconds }}
{{- end -}}
