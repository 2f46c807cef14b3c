"""JSON Schemas (draft 2020-12) for the custom resources the chart renders, which kubernetes-validate cannot check.

Written for this project from the fields, enums and ranges the CRDs document — KServe v1beta1 InferenceService and
v1alpha1 ServingRuntime, Strimzi KafkaTopic and KafkaUser (v1 and v1beta2), KEDA v1alpha1 ScaledObject and
TriggerAuthentication with the Kafka scaler's trigger metadata, Kubeflow v1 PyTorchJob (with its admission webhook's
rules: a DNS-1035 name, one Master, a container named "pytorch"). They cover what the chart sets (and reject unknown keys there); they are
not the full CRDs. What only the operators check at run time (that a storageUri is reachable, that a consumer group
exists) is out of reach here.
"""

from __future__ import annotations

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # RFC 1035 label: what KServe requires of an InferenceService name
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY = {"anyOf": [{"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"},
                      {"type": "number", "minimum": 0}]}
RESOURCES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "requests": {"type": "object", "additionalProperties": QUANTITY},
        "limits": {"type": "object", "additionalProperties": QUANTITY},
    },
}
TOLERATION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "key": {"type": "string"},
        "operator": {"enum": ["Exists", "Equal"]},
        "value": {"type": "string"},
        "effect": {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer"},
    },
}


def _metadata(name_pattern: str, max_length: int = 253, required_labels: tuple[str, ...] = ()) -> dict:
    labels = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}}
    if required_labels:
        labels["required"] = list(required_labels)
    return {
        "type": "object",
        "required": ["name"] + (["labels"] if required_labels else []),
        "properties": {
            "name": {"type": "string", "pattern": name_pattern, "maxLength": max_length},
            "namespace": {"type": "string", "pattern": DNS_LABEL},
            "labels": labels,
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }


def _resource(api_versions: list[str], kind: str, metadata: dict, spec: dict) -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"enum": api_versions},
            "kind": {"const": kind},
            "metadata": metadata,
            "spec": spec,
        },
    }


# --------------------------------------------------------------------------------------------- KServe
MODEL_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["modelFormat"],
    "properties": {
        "modelFormat": {"type": "object", "additionalProperties": False, "required": ["name"],
                        "properties": {"name": {"type": "string", "minLength": 1}, "version": {"type": "string"}}},
        "runtime": {"type": "string", "pattern": DNS_SUBDOMAIN},
        "storageUri": {"type": "string", "pattern": r"^(s3|gs|pvc|hf|https?|oci|hdfs|webhdfs)://.+"},
        "args": {"type": "array", "items": {"type": "string"}},
        "env": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "resources": RESOURCES,
        "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"]}},
    },
}
PREDICTOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model"],
    "properties": {
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
        "timeout": {"type": "integer", "minimum": 1},
        "containerConcurrency": {"type": "integer", "minimum": 0},
        "scaleTarget": {"type": "integer", "minimum": 1},
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
        "serviceAccountName": {"type": "string", "pattern": DNS_SUBDOMAIN},
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array", "items": TOLERATION},
        "volumes": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "model": MODEL_SPEC,
    },
}
INFERENCE_SERVICE = _resource(
    ["serving.kserve.io/v1beta1"], "InferenceService",
    {**_metadata(DNS_LABEL, max_length=45),  # the name gets "-predictor" and a revision suffix in Knative mode
     "properties": {**_metadata(DNS_LABEL, 45)["properties"], "annotations": {
         "type": "object",
         "additionalProperties": {"type": "string"},
         "properties": {"serving.kserve.io/deploymentMode": {
             "enum": ["Knative", "Serverless", "Standard", "RawDeployment", "ModelMesh"]},
             # KServe tags the latest revision's traffic target only for the exact string "true"
             "serving.kserve.io/enable-tag-routing": {"enum": ["true", "false"]}},
     }}},
    {"type": "object", "additionalProperties": False, "required": ["predictor"],
     "properties": {"predictor": PREDICTOR}},
)
SERVING_RUNTIME = _resource(
    ["serving.kserve.io/v1alpha1"], "ServingRuntime", _metadata(DNS_SUBDOMAIN),
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["containers", "supportedModelFormats"],
        "properties": {
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            "disabled": {"type": "boolean"},
            "multiModel": {"type": "boolean"},
            "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
            "supportedModelFormats": {
                "type": "array", "minItems": 1,
                "items": {"type": "object", "additionalProperties": False, "required": ["name"],
                          "properties": {"name": {"type": "string", "minLength": 1}, "version": {"type": "string"},
                                         "autoSelect": {"type": "boolean"}, "priority": {"type": "integer",
                                                                                         "minimum": 1}}},
            },
            "containers": {
                "type": "array", "minItems": 1,
                "items": {"type": "object", "required": ["name", "image"],
                          "properties": {"name": {"type": "string", "pattern": DNS_LABEL},
                                         "image": {"type": "string", "minLength": 1},
                                         "args": {"type": "array", "items": {"type": "string"}},
                                         "command": {"type": "array", "items": {"type": "string"}},
                                         "ports": {"type": "array", "maxItems": 1}}},
            },
        },
    },
)

# --------------------------------------------------------------------------------------------- Strimzi
KAFKA_TOPIC = _resource(
    ["kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2"], "KafkaTopic",
    _metadata(DNS_SUBDOMAIN, required_labels=("strimzi.io/cluster",)),
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["partitions", "replicas"],
        "properties": {
            "topicName": {"type": "string", "pattern": r"^[a-zA-Z0-9._-]{1,249}$"},
            "partitions": {"type": "integer", "minimum": 1},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
            "config": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]},
                       "properties": {"cleanup.policy": {"enum": ["delete", "compact", "compact,delete",
                                                                  "delete,compact"]}}},
        },
    },
)

KAFKA_ACL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["resource", "operations"],
    "properties": {
        "resource": {
            "type": "object", "additionalProperties": False, "required": ["type"],
            "properties": {"type": {"enum": ["topic", "group", "cluster", "transactionalId"]},
                           "name": {"type": "string", "minLength": 1},
                           "patternType": {"enum": ["literal", "prefix"]}},
        },
        "operations": {"type": "array", "minItems": 1, "uniqueItems": True,
                       "items": {"enum": ["Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction",
                                          "AlterConfigs", "DescribeConfigs", "IdempotentWrite", "All"]}},
        "host": {"type": "string"},
        "type": {"enum": ["allow", "deny"]},
    },
}
KAFKA_USER = _resource(
    ["kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2"], "KafkaUser",
    _metadata(DNS_SUBDOMAIN, required_labels=("strimzi.io/cluster",)),
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "authentication": {"type": "object", "additionalProperties": False, "required": ["type"],
                               "properties": {"type": {"enum": ["tls", "tls-external", "scram-sha-512"]}}},
            "authorization": {"type": "object", "additionalProperties": False, "required": ["type", "acls"],
                              "properties": {"type": {"const": "simple"},
                                             "acls": {"type": "array", "items": KAFKA_ACL}}},
        },
    },
)

# --------------------------------------------------------------------------------------------- KEDA
KAFKA_TRIGGER_METADATA = {
    "type": "object",
    "additionalProperties": False,  # every value a string, as the CRD requires
    "required": ["bootstrapServers", "consumerGroup"],
    "properties": {
        "bootstrapServers": {"type": "string", "pattern": r"^[^,\s]+:[0-9]+(,[^,\s]+:[0-9]+)*$"},
        "consumerGroup": {"type": "string", "minLength": 1},
        "topic": {"type": "string", "pattern": r"^[a-zA-Z0-9._-]{1,249}$"},
        "lagThreshold": {"type": "string", "pattern": r"^[1-9][0-9]*$"},
        "activationLagThreshold": {"type": "string", "pattern": r"^[0-9]+$"},
        "offsetResetPolicy": {"enum": ["earliest", "latest"]},
        "allowIdleConsumers": {"enum": ["true", "false"]},
        "excludePersistentLag": {"enum": ["true", "false"]},
        "scaleToZeroOnInvalidOffset": {"enum": ["true", "false"]},
        "limitToPartitionsWithLag": {"enum": ["true", "false"]},
        "sasl": {"enum": ["none", "plaintext", "scram_sha256", "scram_sha512", "gssapi", "oauthbearer"]},
        "tls": {"enum": ["enable", "disable"]},
    },
}
SCALED_OBJECT = _resource(
    ["keda.sh/v1alpha1"], "ScaledObject", _metadata(DNS_SUBDOMAIN),
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["scaleTargetRef", "triggers"],
        "properties": {
            "scaleTargetRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                               "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                              "name": {"type": "string", "minLength": 1}}},
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "advanced": {"type": "object"},
            "triggers": {
                "type": "array", "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type", "metadata"],
                    "properties": {
                        "type": {"const": "kafka"},
                        "name": {"type": "string", "pattern": DNS_LABEL},
                        "metadata": KAFKA_TRIGGER_METADATA,
                        "authenticationRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                              "properties": {"name": {"type": "string"},
                                                             "kind": {"enum": ["TriggerAuthentication",
                                                                               "ClusterTriggerAuthentication"]}}},
                    },
                },
            },
        },
    },
)
TRIGGER_AUTHENTICATION = _resource(
    ["keda.sh/v1alpha1"], "TriggerAuthentication", _metadata(DNS_SUBDOMAIN),
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "secretTargetRef": {
                "type": "array", "minItems": 1,
                "items": {"type": "object", "additionalProperties": False, "required": ["parameter", "name", "key"],
                          "properties": {"parameter": {"enum": ["username", "password", "ca", "cert", "key",
                                                                "keyPassword", "sasl", "tls"]},
                                         "name": {"type": "string", "minLength": 1},
                                         "key": {"type": "string", "minLength": 1}}},
            },
        },
    },
)

# --------------------------------------------------------------------------------------------- Kubeflow
PYTORCH_REPLICA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["replicas", "template"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 1},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {
            "type": "object", "additionalProperties": False, "required": ["spec"],
            "properties": {
                "metadata": {"type": "object"},
                "spec": {"type": "object", "required": ["containers"], "properties": {"containers": {
                    "type": "array", "minItems": 1,
                    "contains": {"type": "object", "required": ["name", "image"],
                                 "properties": {"name": {"const": "pytorch"},
                                                "image": {"type": "string", "minLength": 1}}},
                }}},
            },
        },
    },
}
PYTORCH_JOB = _resource(
    ["kubeflow.org/v1"], "PyTorchJob", _metadata(DNS_LABEL, max_length=63),
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["pytorchReplicaSpecs"],
        "properties": {
            "nprocPerNode": {"type": "string", "pattern": r"^(auto|cpu|gpu|[1-9][0-9]*)$"},
            "runPolicy": {
                "type": "object", "additionalProperties": False,
                "properties": {"cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                               "backoffLimit": {"type": "integer", "minimum": 0},
                               "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                               "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                               "suspend": {"type": "boolean"},
                               "schedulingPolicy": {"type": "object"},
                               "managedBy": {"type": "string"}},
            },
            "elasticPolicy": {"type": "object"},
            "pytorchReplicaSpecs": {
                "type": "object", "additionalProperties": False, "minProperties": 1,
                "properties": {
                    "Master": {**PYTORCH_REPLICA, "properties": {**PYTORCH_REPLICA["properties"],
                                                                 "replicas": {"const": 1}}},
                    "Worker": PYTORCH_REPLICA,
                },
            },
        },
    },
)

SCHEMAS = {
    "InferenceService": INFERENCE_SERVICE,
    "ServingRuntime": SERVING_RUNTIME,
    "KafkaTopic": KAFKA_TOPIC,
    "KafkaUser": KAFKA_USER,
    "ScaledObject": SCALED_OBJECT,
    "TriggerAuthentication": TRIGGER_AUTHENTICATION,
    "PyTorchJob": PYTORCH_JOB,
}
