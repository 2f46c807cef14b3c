{{/*
Names, labels and the computed settings every template shares.
*/}}

{{- define "agentflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-agentflow", or the release name when it already contains the chart name. Short enough that
     "<fullname>-<component>-predictor" (KServe) stays a valid DNS label. */}}
{{- define "agentflow.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agentflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. Call with (dict "root" $ "component" "planner"). */}}
{{- define "agentflow.labels" -}}
helm.sh/chart: {{ include "agentflow.chart" .root }}
{{ include "agentflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: agentflow
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The immutable subset used in selectors. */}}
{{- define "agentflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentflow.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "agentflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentflow.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest. Call with an image block. */}}
{{- define "agentflow.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* The six services of the ring, in start order. */}}
{{- define "agentflow.services" -}}
memory planner executor verifier generator gateway
{{- end -}}

{{/* The services the chart deploys, each a Deployment and a Service (templates/services.yaml): the six of the ring,
then the LLM judge (`agentflow serve judge`, docs/judge.md) with judge.enabled. Call with the root context. */}}
{{- define "agentflow.deployedServices" -}}
{{ include "agentflow.services" . }}{{ if .Values.judge.enabled }} judge{{ end }}
{{- end -}}

{{/* The rollout drivers the chart deploys (templates/driver.yaml), one Deployment per query source: "driver" replays
production traffic (driver.fromTraffic), "driver-dataset" sends driver.dataset.path. Space-separated; empty unless
trainer.enabled and driver.enabled. Call with the root context. */}}
{{- define "agentflow.drivers" -}}
{{- if and .Values.trainer.enabled .Values.driver.enabled -}}
{{- $drivers := list -}}
{{- if .Values.driver.fromTraffic }}{{ $drivers = append $drivers "driver" }}{{ end -}}
{{- if .Values.driver.dataset.path }}{{ $drivers = append $drivers "driver-dataset" }}{{ end -}}
{{- join " " $drivers -}}
{{- end -}}
{{- end -}}

{{/* The trainer's group size (trainer.settings.grpo_group_size, its old name group_size, else the trainer's default
8), and the driver's (driver.groupSize, else the trainer's). */}}
{{- define "agentflow.trainerGroupSize" -}}
{{- $s := .Values.trainer.settings -}}
{{- int (coalesce (get $s "grpo_group_size") (get $s "group_size") 8) -}}
{{- end -}}

{{/* The trainer's staleness bound (trainer/service.py's default 4): the rollout fleet's slots follow it. */}}
{{- define "agentflow.trainerMaxStaleness" -}}
{{- $s := .Values.trainer.settings -}}
{{- if hasKey $s "grpo_max_staleness" -}}{{ int (get $s "grpo_max_staleness") }}{{- else -}}4{{- end -}}
{{- end -}}

{{- define "agentflow.driverGroupSize" -}}
{{- int (coalesce .Values.driver.groupSize (include "agentflow.trainerGroupSize" .)) -}}
{{- end -}}

{{/* How many groups each driver may have sent that the trainer has not finished (AGENTFLOW_DRIVE_MAX_AHEAD_GROUPS,
trainer/pace.py): driver.maxAheadGroups, else (max_staleness + 1) x the trainer's groups per step shared among the
drivers, but never below one step's groups (a driver alone must be able to fill a step). 0: no bound. */}}
{{- define "agentflow.driverMaxAhead" -}}
{{- $set := .Values.driver.maxAheadGroups -}}
{{- if not (kindIs "invalid" $set) -}}{{ int $set }}
{{- else -}}
{{- $s := .Values.trainer.settings -}}
{{- $step := max 1 (div (int (coalesce (get $s "grpo_batch_trajectories") 48)) (int (include "agentflow.trainerGroupSize" .))) -}}
{{- $drivers := len (splitList " " (include "agentflow.drivers" .)) -}}
{{- $total := mul (add (int (include "agentflow.trainerMaxStaleness" .)) 1) $step -}}
{{- max $step (div (add $total $drivers -1) $drivers) -}}
{{- end -}}
{{- end -}}

{{/* Input topics (logical names) of the consumer services: the lag KEDA scales on. */}}
{{- define "agentflow.inputTopics" -}}
{{- $topics := dict "memory" (list "queries" "verdicts" "answers" "feedback") "planner" (list "memory.updated") "executor" (list "plans") "verifier" (list "executions") "generator" (list "finalize") "judge" (list "trajectories") -}}
{{- toJson (get $topics .) -}}
{{- end -}}

{{/* Every topic of the ring (agentflow/bus/topics.py ALL). */}}
{{- define "agentflow.topics" -}}
queries memory.updated plans executions verdicts finalize answers trajectories feedback planner.versions planner.routing rollout.decisions deadletter memory.changelog trainer.progress
{{- end -}}

{{/* Topics compacted instead of expiring by age: one record per key, the latest wins (agentflow/bus/topics.py
COMPACTED): the memory service's state, the planner's routing tables and the trainer's progress. */}}
{{- define "agentflow.compactedTopics" -}}
memory.changelog planner.routing trainer.progress
{{- end -}}

{{/* A service's settings: serviceDefaults overridden key by key by its own block. Returns YAML. */}}
{{- define "agentflow.serviceConfig" -}}
{{- $root := .root -}}
{{- $own := index $root.Values .name | default dict -}}
{{- $merged := mergeOverwrite (deepCopy $root.Values.serviceDefaults) (deepCopy $own) -}}
{{- toYaml $merged -}}
{{- end -}}

{{- define "agentflow.kafkaBootstrap" -}}
{{- if .Values.kafka.bootstrapServers -}}
{{- .Values.kafka.bootstrapServers -}}
{{- else if .Values.strimzi.enabled -}}
{{- $port := has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") | ternary 9093 9092 -}}
{{- printf "%s-kafka-bootstrap.%s.svc:%v" .Values.strimzi.clusterName (default .Release.Namespace .Values.strimzi.topicNamespace) $port -}}
{{- else -}}
{{- fail "kafka.bootstrapServers is empty: give the brokers' host:port list, or enable strimzi to derive it" -}}
{{- end -}}
{{- end -}}

{{- define "agentflow.isvcName" -}}
{{- printf "%s-%s-llm" (include "agentflow.fullname" .root) .which -}}
{{- end -}}

{{/* rollout.kserve.mode pair: the canary InferenceService the rollout controller creates beside the planner's
(agentflow/rollout/kserve_pair.py CANARY_SUFFIX). */}}
{{- define "agentflow.canaryIsvcName" -}}
{{- printf "%s-canary" (include "agentflow.isvcName" (dict "root" . "which" "planner")) -}}
{{- end -}}

{{/* The rollout controller drives the planner with this backend: "kserve-canary", "kserve-pair", "lora", "local",
or "" when it is off. */}}
{{- define "agentflow.rolloutBackend" -}}
{{- if .Values.rollout.enabled -}}
{{- if eq .Values.rollout.backend "kserve" -}}{{ printf "kserve-%s" .Values.rollout.kserve.mode }}
{{- else -}}{{ .Values.rollout.backend }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* backend lora: the vLLM planner Deployment's Service and the base model it loads. */}}
{{- define "agentflow.loraName" -}}
{{- printf "%s-planner-vllm" (include "agentflow.fullname" .) -}}
{{- end -}}

{{/* The rollout fleet (rollout.fleet): a vLLM that only the driver's pinned rollouts reach. */}}
{{- define "agentflow.fleetName" -}}
{{- printf "%s-planner-fleet" (include "agentflow.fullname" .) -}}
{{- end -}}

{{/* Its kind (agentflow/rollout/fleet.py): "lora" with backend lora (adapters); "vllm" with backend kserve (full
weights replaced in place, read from the model store's claim or, with an object store, from the copies of the
fleet-mirror sidecar); "" otherwise (none). */}}
{{- define "agentflow.fleetKind" -}}
{{- $backend := include "agentflow.rolloutBackend" . -}}
{{- if .Values.rollout.fleet.enabled -}}
{{- if eq $backend "lora" -}}lora
{{- else if hasPrefix "kserve" $backend -}}vllm
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the full-weight fleet reads an object store's versions through its fleet-mirror sidecar. */}}
{{- define "agentflow.fleetMirror" -}}
{{- if and (eq (include "agentflow.fleetKind" .) "vllm") .Values.trainer.modelStore.uri -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the full-weight fleet's admin token: rollout.fleet.adminTokenSecret, else the chart's own. */}}
{{- define "agentflow.fleetTokenSecret" -}}
{{- default (printf "%s-fleet-admin" (include "agentflow.fullname" .)) .Values.rollout.fleet.adminTokenSecret -}}
{{- end -}}

{{- define "agentflow.fleetEnabled" -}}
{{- if include "agentflow.fleetKind" . -}}true{{- end -}}
{{- end -}}

{{- define "agentflow.loraBaseModel" -}}
{{- default (printf "%s/v000000" (trimSuffix "/" .Values.trainer.modelStore.mountPath)) .Values.rollout.lora.baseModel -}}
{{- end -}}

{{/* The URL patterns (fnmatch, comma-separated) the planner's routing table may name
(AGENTFLOW_PLANNER_ROUTING_ENDPOINTS): per backend, where agentflow/rollout says each version is served, then
rollout.routingEndpoints. Each host is matched exactly, with any port or path after it. */}}
{{- define "agentflow.routingEndpoints" -}}
{{- $root := . -}}
{{- $ns := .Release.Namespace -}}
{{- $backend := include "agentflow.rolloutBackend" . -}}
{{- $hosts := list -}}
{{- if hasPrefix "kserve-" $backend -}}
{{- $isvc := include "agentflow.isvcName" (dict "root" . "which" "planner") -}}
{{- $names := list $isvc -}}
{{- if eq $backend "kserve-pair" -}}{{- $names = append $names (include "agentflow.canaryIsvcName" .) -}}{{- end -}}
{{- range $name := $names -}}
{{- /* status.address.url: <isvc>.<ns> (Knative), <isvc>-predictor.<ns> (Standard; also the predictor's own) */ -}}
{{- $hosts = concat $hosts (list $name (printf "%s-predictor" $name)) -}}
{{- if eq $backend "kserve-canary" -}}
{{- /* Knative's tag routes of the predictor: latest-<isvc>-predictor, prev-<isvc>-predictor */ -}}
{{- $hosts = concat $hosts (list (printf "latest-%s-predictor" $name) (printf "prev-%s-predictor" $name)) -}}
{{- end -}}
{{- end -}}
{{- else if eq $backend "lora" -}}
{{- $hosts = list (include "agentflow.loraName" .) -}}
{{- else if eq $backend "local" -}}
{{- $hosts = list (printf "%s-llm" (include "agentflow.fullname" .)) -}}
{{- end -}}
{{- if include "agentflow.fleetEnabled" . -}}{{- $hosts = append $hosts (include "agentflow.fleetName" .) -}}{{- end -}}
{{- $patterns := list -}}
{{- range $host := $hosts -}}
{{- $fqdn := printf "%s.%s.svc.cluster.local" $host $ns -}}
{{- $patterns = concat $patterns (list (printf "http://%s/*" $fqdn) (printf "http://%s:*" $fqdn)) -}}
{{- end -}}
{{- join "," (concat $patterns .Values.rollout.routingEndpoints) -}}
{{- end -}}

{{- define "agentflow.runtimeName" -}}
{{- default (printf "%s-vllm" (include "agentflow.fullname" .)) .Values.kserve.runtime.name -}}
{{- end -}}

{{/* The OpenAI base URL one LLM role (planner | frozen) is reached at. */}}
{{- define "agentflow.llmEndpoint" -}}
{{- $root := .root -}}
{{- $role := index $root.Values.llm .which -}}
{{- $isvc := index $root.Values.kserve .which -}}
{{- if $role.endpoint -}}
{{- $role.endpoint -}}
{{- else if and (eq .which "planner") (eq (include "agentflow.rolloutBackend" $root) "lora") -}}
{{- printf "http://%s.%s.svc.cluster.local:%v/v1" (include "agentflow.loraName" $root) $root.Release.Namespace $root.Values.rollout.lora.port -}}
{{- else if and $root.Values.kserve.enabled $isvc.enabled -}}
{{- printf "http://%s-predictor.%s.svc.cluster.local%s" (include "agentflow.isvcName" .) $root.Release.Namespace $root.Values.kserve.runtime.openaiPath -}}
{{- else if $root.Values.llmServer.enabled -}}
{{- printf "http://%s-llm.%s.svc.cluster.local:%v/v1" (include "agentflow.fullname" $root) $root.Release.Namespace $root.Values.llmServer.port -}}
{{- else -}}
{{- fail (printf "no LLM for the %s: enable kserve.%s (with kserve.enabled) or llmServer, or set llm.%s.endpoint" .which .which .which) -}}
{{- end -}}
{{- end -}}

{{- define "agentflow.llmModel" -}}
{{- $root := .root -}}
{{- $role := index $root.Values.llm .which -}}
{{- $isvc := index $root.Values.kserve .which -}}
{{- if $role.model -}}
{{- $role.model -}}
{{- else if $role.endpoint -}}
{{- "" -}}
{{- else if and (eq .which "planner") (eq (include "agentflow.rolloutBackend" $root) "lora") -}}
{{- $root.Values.rollout.lora.servedModelName -}}
{{- else if and $root.Values.kserve.enabled $isvc.enabled -}}
{{- $isvc.servedModelName -}}
{{- else -}}
{{- $root.Values.llmServer.servedName -}}
{{- end -}}
{{- end -}}

{{/* Pod-level scheduling keys. Call with a settings dict. */}}
{{- define "agentflow.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Env every AgentFlow container gets besides the shared ConfigMap: pod identity, OTEL service name, secrets. */}}
{{- define "agentflow.commonEnv" -}}
{{- $root := .root -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: OTEL_SERVICE_NAME
  value: {{ printf "agentflow-%s" .component | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "agentflow.otelResource" (dict "root" $root "component" .component) | quote }}
{{- $userAuth := include "agentflow.kafkaUserAuth" $root }}
{{- if eq $userAuth "tls" }}
- name: AGENTFLOW_KAFKA_TLS_CERTFILE
  value: /etc/agentflow/kafka-user/user.crt
- name: AGENTFLOW_KAFKA_TLS_KEYFILE
  value: /etc/agentflow/kafka-user/user.key
{{- else if eq $userAuth "scram-sha-512" }}
- name: AGENTFLOW_KAFKA_SASL_MECHANISM
  value: SCRAM-SHA-512
- name: AGENTFLOW_KAFKA_SASL_USERNAME
  value: {{ include "agentflow.kafkaUser" . }}
- name: AGENTFLOW_KAFKA_SASL_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "agentflow.kafkaUser" . }}, key: password}}
{{- else if $root.Values.kafka.sasl.existingSecret }}
- name: AGENTFLOW_KAFKA_SASL_USERNAME
  valueFrom: {secretKeyRef: {name: {{ $root.Values.kafka.sasl.existingSecret }}, key: {{ $root.Values.kafka.sasl.usernameKey }}}}
- name: AGENTFLOW_KAFKA_SASL_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $root.Values.kafka.sasl.existingSecret }}, key: {{ $root.Values.kafka.sasl.passwordKey }}}}
{{- end }}
{{- $keySecret := $root.Values.llm.apiKeySecret }}
{{- $keyKey := $root.Values.llm.apiKeyKey }}
{{- if and (eq .component "judge") (or $root.Values.judge.apiKeySecret $root.Values.judge.endpoint) }}
{{- /* the judge's own endpoint gets the judge's own key (or none), never the token of the chart's LLMs */}}
{{- $keySecret = $root.Values.judge.apiKeySecret }}
{{- $keyKey = $root.Values.judge.apiKeyKey }}
{{- end }}
{{- /* the drivers call only the gateway, with their own key: never the chart's LLM token */}}
{{- if and $keySecret (not (hasPrefix "driver" .component)) }}
- name: AGENTFLOW_API_KEY
  valueFrom: {secretKeyRef: {name: {{ $keySecret }}, key: {{ $keyKey }}}}
{{- end }}
{{- end -}}

{{- define "agentflow.otelResource" -}}
{{- $attrs := list (printf "service.namespace=%s" .root.Release.Namespace) "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" "k8s.node.name=$(NODE_NAME)" (printf "app.component=%s" .component) (printf "service.version=%s" .root.Chart.AppVersion) -}}
{{- range $k, $v := .root.Values.otel.resourceAttributes -}}
{{- $attrs = append $attrs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $attrs -}}
{{- end -}}

{{/* Volumes for the Kafka CA and, with strimzi.users over TLS, the component's client certificate. Takes
(dict "root" . "component" NAME). */}}
{{- define "agentflow.kafkaTlsVolumeMount" -}}
{{- if .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/agentflow/kafka
  readOnly: true
{{- end }}
{{- if eq (include "agentflow.kafkaUserAuth" .root) "tls" }}
- name: kafka-user
  mountPath: /etc/agentflow/kafka-user
  readOnly: true
{{- end }}
{{- end -}}

{{- define "agentflow.kafkaTlsVolume" -}}
{{- if .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .root.Values.kafka.tls.caSecret }}
    items:
      - {key: {{ .root.Values.kafka.tls.caKey }}, path: ca.crt}
{{- end }}
{{- if eq (include "agentflow.kafkaUserAuth" .root) "tls" }}
- name: kafka-user
  secret:
    secretName: {{ include "agentflow.kafkaUser" . }}
    items:
      - {key: user.crt, path: user.crt}
      - {key: user.key, path: user.key}
{{- end }}
{{- end -}}

{{/* strimzi.users: how the components authenticate to Kafka ("tls", "scram-sha-512", or "" when off). */}}
{{- define "agentflow.kafkaUserAuth" -}}
{{- if and .Values.strimzi.enabled .Values.strimzi.users.enabled -}}
{{- if eq .Values.kafka.securityProtocol "SSL" -}}tls
{{- else if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}scram-sha-512
{{- else -}}
{{- fail (printf "strimzi.users needs an authenticating listener, but kafka.securityProtocol is %s: use SSL (mTLS) or SASL_SSL (SCRAM), or set strimzi.users.enabled=false" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The KafkaUser (and its Strimzi-made Secret) of a component. Takes (dict "root" . "component" NAME). */}}
{{- define "agentflow.kafkaUser" -}}
{{- printf "%s-%s" (include "agentflow.fullname" .root) .component -}}
{{- end -}}

{{/* What each component may do on Kafka with strimzi.users: the logical topics it reads and writes, and its
consumer group (topicPrefix + name for the workers; the trainer's is "trainer"). Nothing else is allowed. The
rollout controller alone writes planner.routing; the planner follows it outside its group. The drivers read, outside
any group, the trainer's progress (which bounds them) and, the traffic driver (driver.fromTraffic), trajectories. */}}
{{- define "agentflow.kafkaAccess" -}}
gateway: {read: [plans, executions, verdicts, answers, trajectories], write: [queries, feedback], group: ""}
memory: {read: [queries, verdicts, answers, feedback, deadletter, memory.changelog], write: [memory.updated, finalize, trajectories, memory.changelog, deadletter], group: memory}
planner: {read: [memory.updated, planner.routing], write: [plans, deadletter], group: planner}
executor: {read: [plans], write: [executions, deadletter], group: executor}
verifier: {read: [executions], write: [verdicts, deadletter], group: verifier}
generator: {read: [finalize], write: [answers, deadletter], group: generator}
trainer: {read: [trajectories, planner.versions], write: [planner.versions, trainer.progress], group: trainer}
rollout: {read: [planner.versions, trajectories, rollout.decisions], write: [rollout.decisions, planner.routing, deadletter], group: rollout}
{{- if .Values.judge.enabled }}
judge: {read: [trajectories], write: [feedback, deadletter], group: judge}
{{- end }}
{{- $drivers := splitList " " (include "agentflow.drivers" .) }}
{{- if has "driver" $drivers }}
driver: {read: [trajectories, trainer.progress], write: [], group: ""}
{{- end }}
{{- if has "driver-dataset" $drivers }}
driver-dataset: {read: [trainer.progress], write: [], group: ""}
{{- end }}
{{- end -}}

{{/* What runs the trainer: "deployment" (trainer.nodes 1), else trainer.distributed.kind, where auto is
"pytorchjob" when the cluster serves Kubeflow's PyTorchJob and "indexedJob" otherwise. */}}
{{- define "agentflow.trainerKind" -}}
{{- $kind := .Values.trainer.distributed.kind -}}
{{- if le (int .Values.trainer.nodes) 1 -}}deployment
{{- else if ne $kind "auto" -}}{{ $kind }}
{{- else -}}{{ ternary "pytorchjob" "indexedJob" (.Capabilities.APIVersions.Has "kubeflow.org/v1/PyTorchJob") }}
{{- end -}}
{{- end -}}

{{/* Cross-field checks the JSON schema cannot express; each fails the render with the setting's name. */}}
{{- define "agentflow.validate" -}}
{{- $v := .Values -}}
{{- range $name := splitList " " (include "agentflow.deployedServices" .) -}}
{{- $svc := include "agentflow.serviceConfig" (dict "root" $ "name" $name) | fromYaml -}}
{{- $needed := add (mul 2 (int $svc.graceSeconds)) 5 -}}
{{- if lt (int $svc.terminationGracePeriodSeconds) (int $needed) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must be at least 2 x graceSeconds + 5 (%v): the worker drains, then the gRPC server stops, each within graceSeconds" $name $svc.terminationGracePeriodSeconds $needed) -}}
{{- end -}}
{{- if and $svc.autoscaling.enabled (gt (int $svc.autoscaling.minReplicas) (int $svc.autoscaling.maxReplicas)) -}}
{{- fail (printf "%s.autoscaling.minReplicas (%v) is above maxReplicas (%v)" $name $svc.autoscaling.minReplicas $svc.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if and $svc.autoscaling.enabled (ne $name "gateway") (gt (int $svc.autoscaling.maxReplicas) (int $v.kafka.partitions)) -}}
{{- fail (printf "%s.autoscaling.maxReplicas (%v) exceeds kafka.partitions (%v): replicas beyond the partition count would sit idle" $name $svc.autoscaling.maxReplicas $v.kafka.partitions) -}}
{{- end -}}
{{- end -}}
{{- $mem := include "agentflow.serviceConfig" (dict "root" $ "name" "memory") | fromYaml -}}
{{- if or $mem.autoscaling.enabled (gt (int $mem.replicas) 1) -}}
{{- fail "memory runs one replica (it keeps in-flight trajectories in process): set memory.replicas to 1 and memory.autoscaling.enabled to false" -}}
{{- end -}}
{{- if and $v.rollout.enabled (eq $v.rollout.backend "local") (not $v.llmServer.adminTokenSecret) -}}
{{- fail "rollout.backend local drives llmServer's admin API, which is off without a token: set llmServer.adminTokenSecret" -}}
{{- end -}}
{{- $sandbox := $v.executor.sandbox -}}
{{- if and $sandbox.namespaces (eq $sandbox.seccompProfile.type "RuntimeDefault") -}}
{{- fail "executor.sandbox.namespaces needs executor.sandbox.seccompProfile of type Localhost or Unconfined: the runtime's default seccomp profile refuses unshare(2) and mount(2)" -}}
{{- end -}}
{{- if $v.kafka.sasl.mechanism -}}
{{- if not (hasPrefix "SASL_" $v.kafka.securityProtocol) -}}
{{- fail (printf "kafka.sasl.mechanism is set but kafka.securityProtocol is %s: use SASL_PLAINTEXT or SASL_SSL" $v.kafka.securityProtocol) -}}
{{- end -}}
{{- end -}}
{{- if and (hasPrefix "SASL_" $v.kafka.securityProtocol) (not (include "agentflow.kafkaUserAuth" $)) (or (not $v.kafka.sasl.mechanism) (not $v.kafka.sasl.existingSecret)) -}}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.mechanism and kafka.sasl.existingSecret" $v.kafka.securityProtocol) -}}
{{- end -}}
{{- if and $v.kafka.tls.caSecret (not (has $v.kafka.securityProtocol (list "SSL" "SASL_SSL"))) -}}
{{- fail (printf "kafka.tls.caSecret is set but kafka.securityProtocol is %s: use SSL or SASL_SSL" $v.kafka.securityProtocol) -}}
{{- end -}}
{{- if $v.kserve.enabled -}}
{{- range $which := list "planner" "frozen" -}}
{{- $isvc := index $v.kserve $which -}}
{{- if $isvc.enabled -}}
{{- if not $isvc.storageUri -}}
{{- fail (printf "kserve.%s.storageUri is empty: give the model's s3://, gs://, pvc:// or hf:// URI" $which) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $isvc.canaryTrafficPercent)) (not (has $v.kserve.deploymentMode (list "Knative" "Serverless"))) -}}
{{- fail (printf "kserve.%s.canaryTrafficPercent needs kserve.deploymentMode Knative (Serverless): %s mode has no traffic splitting" $which $v.kserve.deploymentMode) -}}
{{- end -}}
{{- if gt (int $isvc.minReplicas) (int $isvc.maxReplicas) -}}
{{- fail (printf "kserve.%s.minReplicas (%v) is above maxReplicas (%v)" $which $isvc.minReplicas $isvc.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.trainer.enabled -}}
{{- $store := $v.trainer.modelStore -}}
{{- if and (not $store.uri) (not $store.pvc.create) (not $store.pvc.existingClaim) -}}
{{- fail "trainer.modelStore needs a uri, trainer.modelStore.pvc.create, or trainer.modelStore.pvc.existingClaim" -}}
{{- end -}}
{{- $nodes := int $v.trainer.nodes -}}
{{- if and (gt $nodes 1) (lt (int $v.trainer.gpusPerNode) 1) -}}
{{- fail (printf "trainer.nodes is %v: a multi-node trainer runs one torchrun process per GPU, so set trainer.gpusPerNode (>= 1)" $nodes) -}}
{{- end -}}
{{- if and (gt $nodes 1) (or $store.uri (not (has "ReadWriteMany" $store.pvc.accessModes))) -}}
{{- fail (printf "trainer.nodes is %v: every rank writes its share of each version's resume state into the model store, so it must be a ReadWriteMany claim that every node mounts (trainer.modelStore.pvc.accessModes: [ReadWriteMany], also for an existingClaim), not trainer.modelStore.uri" $nodes) -}}
{{- end -}}
{{- end -}}
{{- if $v.rollout.enabled -}}
{{- $rs := $v.rollout.settings -}}
{{- if and (eq (toString (dig "reward_source" "any" $rs)) "rule") (not (dig "traffic_ground_truth" false $rs)) -}}
{{- fail "rollout.settings.reward_source is rule, which needs a ground truth on the canaries' queries, and rollout.settings.traffic_ground_truth is false (production traffic has none): no canary could be rewarded, and each would roll back on its timeout. Use feedback, judge or any (docs/rewards.md, \"Canaries on production rewards\"), or set traffic_ground_truth: true where the queries carry answers" -}}
{{- end -}}
{{- if ne (int (last $v.rollout.steps)) 100 -}}
{{- fail (printf "rollout.steps must end at 100 (full promotion), got %v" $v.rollout.steps) -}}
{{- end -}}
{{- if and (eq $v.rollout.backend "kserve") (not (and $v.kserve.enabled $v.kserve.planner.enabled)) -}}
{{- fail "rollout.backend kserve needs kserve.enabled and kserve.planner.enabled (the InferenceService it patches)" -}}
{{- end -}}
{{- if and (eq $v.rollout.backend "kserve") (eq $v.rollout.kserve.mode "canary") (not (has $v.kserve.deploymentMode (list "Knative" "Serverless"))) -}}
{{- fail (printf "rollout.backend kserve in rollout.kserve.mode canary moves traffic with canaryTrafficPercent, which needs kserve.deploymentMode Knative (Serverless), not %s; rollout.kserve.mode pair works in Standard mode" $v.kserve.deploymentMode) -}}
{{- end -}}
{{- if and (eq $v.rollout.backend "kserve") (eq $v.rollout.kserve.mode "pair") (gt (len (include "agentflow.canaryIsvcName" $)) 45) -}}
{{- fail (printf "rollout.kserve.mode pair: the canary InferenceService's name %s is longer than 45 characters (KServe appends \"-predictor\" and a revision): shorten the release name or set fullnameOverride" (include "agentflow.canaryIsvcName" $)) -}}
{{- end -}}
{{- if and (eq $v.rollout.backend "kserve") (eq $v.rollout.kserve.mode "pair") (not (kindIs "invalid" $v.kserve.planner.canaryTrafficPercent)) -}}
{{- fail "rollout.kserve.mode pair splits traffic in the routing table: leave kserve.planner.canaryTrafficPercent null" -}}
{{- end -}}
{{- if eq $v.rollout.backend "lora" -}}
{{- $store := $v.trainer.modelStore -}}
{{- if not $v.trainer.enabled -}}
{{- fail "rollout.backend lora serves the adapters the trainer writes into its model store: enable the trainer" -}}
{{- end -}}
{{- if or $store.uri (and (not $store.pvc.create) (not $store.pvc.existingClaim)) (not (has "ReadWriteMany" $store.pvc.accessModes)) -}}
{{- fail "rollout.backend lora: vLLM loads each version's adapter from a folder, so the trainer's model store must be a ReadWriteMany claim (trainer.modelStore.uri empty, trainer.modelStore.pvc with accessModes [ReadWriteMany]) that the vLLM pod mounts at trainer.modelStore.mountPath" -}}
{{- end -}}
{{- if and $v.kserve.enabled $v.kserve.planner.enabled -}}
{{- fail "rollout.backend lora serves the planner from the vLLM Deployment (rollout.lora): set kserve.planner.enabled=false" -}}
{{- end -}}
{{- if ne (toString (dig "export" "adapter" $v.trainer.settings)) "adapter" -}}
{{- fail "rollout.backend lora loads adapters: set trainer.settings.export to adapter (or leave it unset)" -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.rollout.backend "local") (not $v.llmServer.enabled) -}}
{{- fail "rollout.backend local drives the llmServer: enable llmServer" -}}
{{- end -}}
{{- if and (eq (include "agentflow.fleetKind" $) "vllm") (not (include "agentflow.fleetMirror" $)) (not (has "ReadWriteMany" $v.trainer.modelStore.pvc.accessModes)) -}}
{{- fail "rollout.fleet: the full-weight rollout fleet loads each version from the trainer's model store, so a claim must be ReadWriteMany (trainer.modelStore.pvc.accessModes [ReadWriteMany]) for its vLLM pod to mount it; or keep the versions in an object store (trainer.modelStore.uri: the fleet's sidecar copies them), or set rollout.fleet.enabled=false" -}}
{{- end -}}
{{- end -}}
{{- if and $v.trainer.enabled $v.driver.enabled -}}
{{- $d := $v.driver -}}
{{- if not (include "agentflow.drivers" $) -}}
{{- fail "driver has no query source: set driver.fromTraffic=true (replay production traffic) or driver.dataset.path (a labelled JSONL file), or driver.enabled=false (then nothing in the release makes training rollouts: run agentflow drive yourself)" -}}
{{- end -}}
{{- if not $v.gateway.apiKeysSecret -}}
{{- if not $d.allowAnonymousTraining -}}
{{- fail "driver: the gateway has no API keys (gateway.apiKeysSecret is empty), so it serves every caller as anonymous with the scopes solve and feedback, and it would refuse the driver's training rollouts (they need the scope train). Give the gateway keys (agentflow keys new driver --scopes solve,train: its entry into the Secret gateway.apiKeysSecret, the key into driver.apiKeySecret), or set driver.allowAnonymousTraining=true to give every caller that reaches the gateway the train scope (development only), or set driver.enabled=false" -}}
{{- end -}}
{{- else if not $d.apiKeySecret -}}
{{- fail "driver.apiKeySecret is empty, but the gateway checks API keys (gateway.apiKeysSecret): make the driver's key with agentflow keys new driver --scopes solve,train, add its entry to the gateway's Secret and put the key into a Secret named by driver.apiKeySecret (key driver.apiKeyKey)" -}}
{{- end -}}
{{- $path := $d.dataset.path -}}
{{- if and $d.dataset.configMap $d.dataset.persistentVolumeClaim -}}
{{- fail "driver.dataset: give the file in a configMap or a persistentVolumeClaim, not both" -}}
{{- end -}}
{{- if and $path (not (regexMatch "^synthetic(:[0-9]+)?$" $path)) (not (hasPrefix "/" $path)) (not $d.dataset.configMap) (not $d.dataset.persistentVolumeClaim) -}}
{{- fail (printf "driver.dataset.path %s is a file name, but no volume holds it: set driver.dataset.configMap or driver.dataset.persistentVolumeClaim (drive reads local files, not object-store URIs)" $path) -}}
{{- end -}}
{{- if and $d.dataset.configMap (or (hasPrefix "/" $path) (contains "/" $path)) -}}
{{- fail (printf "driver.dataset.path %s: with driver.dataset.configMap give the file's key in the ConfigMap (a name without /)" $path) -}}
{{- end -}}
{{- $trainerG := include "agentflow.trainerGroupSize" $ -}}
{{- if and (not (kindIs "invalid" $d.groupSize)) (ne (int $d.groupSize) (int $trainerG)) -}}
{{- fail (printf "driver.groupSize (%v) differs from the trainer's group size (%v, trainer.settings.grpo_group_size): the trainer completes a group at its own size, so larger groups are cut and smaller ones wait group_timeout_s; leave driver.groupSize null to follow the trainer" (int $d.groupSize) $trainerG) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* prometheus.io/* pod annotations for a pod serving /metrics on metrics.port (nothing when off). */ -}}
{{- define "agentflow.metricsAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.podAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{- /*
The search tools' settings for the modules (docs/tools.md): endpoints, the web search provider and its key from a
Secret, and the dense retriever's URL (and token) when retriever.enabled.
*/ -}}
{{- define "agentflow.searchToolsEnv" -}}
{{- $t := .Values.searchTools -}}
{{- with $t.wikipedia.endpoint }}
- {name: AGENTFLOW_WIKIPEDIA_URL, value: {{ . | quote }}}
{{- end }}
- {name: AGENTFLOW_WEB_SEARCH_PROVIDER, value: {{ $t.webSearch.provider | quote }}}
{{- with $t.webSearch.endpoint }}
- {name: AGENTFLOW_WEB_SEARCH_URL, value: {{ . | quote }}}
{{- end }}
{{- if $t.webSearch.apiKeySecret }}
- name: AGENTFLOW_WEB_SEARCH_API_KEY
  valueFrom: {secretKeyRef: {name: {{ $t.webSearch.apiKeySecret }}, key: {{ $t.webSearch.apiKeyKey }}}}
{{- end }}
{{- if .Values.retriever.enabled }}
- name: AGENTFLOW_RETRIEVER_URL
  value: {{ printf "http://%s-retriever:%v/search" (include "agentflow.fullname" .) .Values.retriever.port | quote }}
{{- if .Values.retriever.tokenSecret }}
- name: AGENTFLOW_RETRIEVER_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.retriever.tokenSecret }}, key: {{ .Values.retriever.tokenKey }}}}
{{- end }}
{{- end }}
{{- end -}}

{{- /* A Kubernetes quantity of bytes (4Gi, 500G, 1.5Ti, 1000000) in GiB, as a float. */ -}}
{{- define "agentflow.gib" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $unit := trimPrefix $number $q -}}
{{- $per := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 -}}
{{- if or (not $number) (not (hasKey $per $unit)) -}}
{{- fail (printf "%q is not a size in bytes (e.g. 200Gi, 500G)" $q) -}}
{{- end -}}
{{- divf (mulf (float64 $number) (get $per $unit)) 1073741824.0 -}}
{{- end -}}

{{- /* What the trainer keeps on disk, from trainer.model.parametersB (docs/deploy.md, "The trainer's disk"), as JSON:
{"store": GiB, "cache": GiB}; {} when parametersB is 0 (unknown). Per version: the serving folder in the training
dtype (bfloat16 on GPUs: 2 bytes a parameter) or the LoRA adapter alone (adapterShare of the parameters), and resume/
(float32 trained weights and AdamW's two moments: 12 bytes a trained parameter). The store holds v0 (the base, full),
keep_last versions plus eight that pruning spares (the KL reference, the stable, the canary, the four last withdrawn,
the one being written) and keep_resume + 1 resume states. The cache holds the base model and, with an object store,
a copy of the store; a local store is its own cache. */ -}}
{{- define "agentflow.trainerDisk" -}}
{{- $t := .Values.trainer -}}
{{- $s := $t.settings -}}
{{- $params := float64 (default 0 $t.model.parametersB) -}}
{{- if le $params 0.0 -}}
{}
{{- else -}}
{{- range $key := list "keep_last" "keep_resume" -}}
{{- if and (hasKey $s $key) (eq (int (get $s $key)) 0) -}}
{{- fail (printf "trainer.settings.%s 0 keeps every version's files, so no disk fits them: set a number (trainer.model.parametersB sizes the disk)" $key) -}}
{{- end -}}
{{- end -}}
{{- $keepLast := ternary (int (get $s "keep_last")) 10 (hasKey $s "keep_last") -}}
{{- $keepResume := ternary (int (get $s "keep_resume")) 2 (hasKey $s "keep_resume") -}}
{{- $dtype := default (ternary "bfloat16" "float32" (gt (int $t.gpusPerNode) 0)) $s.dtype -}}
{{- $bytes := ternary 2.0 4.0 (eq $dtype "bfloat16") -}}
{{- $lora := gt (int (default 0 $s.lora_rank)) 0 -}}
{{- $trained := ternary (mulf $params $t.model.adapterShare) $params $lora -}}
{{- $full := divf (mulf $params $bytes 1e9) 1073741824.0 -}}
{{- $version := ternary (divf (mulf $trained $bytes 1e9) 1073741824.0) $full (and $lora (ne (default "adapter" $s.export) "merged")) -}}
{{- $resume := divf (mulf $trained 12.0 1e9) 1073741824.0 -}}
{{- $store := addf $full (mulf (add $keepLast 8) $version) (mulf (add $keepResume 1) $resume) -}}
{{- $cache := ternary (addf $full $store) $full (ne $t.modelStore.uri "") -}}
{{- dict "store" $store "cache" $cache "version" $version "resume" $resume "full" $full | toJson -}}
{{- end -}}
{{- end -}}

{{- /* The trainer's model cache volume size: trainer.cache.size, else computed from the disk need (10 % headroom,
whole GiB), else 20Gi. Fails when a given cache or store claim cannot hold what the trainer keeps. */ -}}
{{- define "agentflow.trainerCacheSize" -}}
{{- $t := .Values.trainer -}}
{{- $disk := include "agentflow.trainerDisk" . | fromJson -}}
{{- if and $disk.store (not $t.modelStore.uri) $t.modelStore.pvc.create (not $t.modelStore.pvc.existingClaim) -}}
{{- $claim := include "agentflow.gib" $t.modelStore.pvc.size | float64 -}}
{{- if lt $claim (float64 $disk.store) -}}
{{- fail (printf "trainer.modelStore.pvc.size %s cannot hold what the trainer keeps: about %.0f GiB for %vB parameters (docs/deploy.md, \"The trainer's disk\"); raise the size or lower trainer.settings.keep_last / keep_resume" (toString $t.modelStore.pvc.size) (ceil $disk.store) $t.model.parametersB) -}}
{{- end -}}
{{- end -}}
{{- if $t.cache.size -}}
{{- if and $disk.cache (lt (include "agentflow.gib" $t.cache.size | float64) (float64 $disk.cache)) -}}
{{- fail (printf "trainer.cache.size %s cannot hold what the trainer caches: about %.0f GiB for %vB parameters (docs/deploy.md, \"The trainer's disk\"); raise it, or leave it empty to have it computed" (toString $t.cache.size) (ceil $disk.cache) $t.model.parametersB) -}}
{{- end -}}
{{- $t.cache.size -}}
{{- else if $disk.cache -}}
{{- printf "%dGi" (int (ceil (mulf $disk.cache 1.1))) -}}
{{- else -}}
20Gi
{{- end -}}
{{- end -}}
