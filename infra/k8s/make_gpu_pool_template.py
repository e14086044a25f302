"""The base job template of the Prefect ``kubernetes`` work pool ``gpu``.

prefect-kubernetes' default template, plus what loragate's GPU flow runs need:

- ``node_selector`` (object of strings, default ``{"nvidia.com/gpu.present": "true"}``) ->
  the pod's ``nodeSelector``, and ``gpu_limit`` (integer >= 0, default 1) -> the flow
  container's ``resources.limits["nvidia.com/gpu"]``. prefect.yaml sets both as the ``gpu``
  pool's ``job_variables``; a local *process* pool named ``gpu`` stores and ignores them.
- Defaults for this namespace and image: ``namespace`` ``loragate``, ``image`` the loragate
  image (a placeholder tag: set your build with ``prefect work-pool update`` or a
  deployment's ``image`` job variable), ``env`` ``LORAGATE_VALIDATION_DEVICE=cuda``.
- Settings from the namespace (``envFrom`` the ``loragate-config`` ConfigMap) and the
  Prefect API credential from the pool's ``loragate-gpu-env`` Secret (``envFrom``: it holds
  that key alone), never from job variables the Prefect API would store. The signing role's
  token, the signing key, the signing role's database URL (``loragate_signing``, never the
  owner's) and the Slack token come from the pool's own Secret ``loragate-gpu``, mounted
  read-only at ``/var/run/secrets/loragate`` (``LORAGATE_SECRETS_DIR``): no other pod mounts it.
- No adapter volume: validation materializes into scratch space, and the pod that holds the
  signing key -- whose image and command job variables choose -- writes nothing the
  replicas load (the ``canary`` deployment, which materializes there, has a pool of its own).
- The base models read-only at ``/models`` (the ``loragate-models`` claim), where shadow
  validation finds the base the catalog pinned, and a toleration for GPU-tainted nodes.
- ``parallelism`` / ``completions`` moved from the pod spec, where prefect-kubernetes puts
  them and Kubernetes has no such fields, to the Job spec, where they mean what they say.

Regenerate when prefect-kubernetes changes (tests/test_k8s_manifests.py fails until then)::

    python -m infra.k8s.make_gpu_pool_template > infra/k8s/gpu-pool-template.json
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

NAMESPACE = "loragate"
# a placeholder tag: an operator replaces it with the image built for the GPU nodes
IMAGE = "ghcr.io/example/loragate:0.1.0"
CONFIG_MAP = "loragate-config"
ENV_SECRET = "loragate-gpu-env"
POOL_SECRET = "loragate-gpu"
SECRETS_PATH = "/var/run/secrets/loragate"
MODELS_CLAIM = "loragate-models"
MODELS_PATH = "/models"
GPU_RESOURCE = "nvidia.com/gpu"
FLOW_CONTAINER = "prefect-job"


def default_template() -> dict[str, Any]:
    """prefect-kubernetes' own default base job template (what ``--type kubernetes`` gets)."""
    from prefect_kubernetes.worker import KubernetesWorker

    return KubernetesWorker.get_default_base_job_template()


def gpu_pool_template(base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (default: prefect-kubernetes' template) with the ``gpu`` pool's additions."""
    template = copy.deepcopy(base if base is not None else default_template())
    variables = template["variables"]["properties"]
    variables["node_selector"] = {
        "title": "Node Selector",
        "description": "Labels a node must carry to run the flow's pod (the pod's nodeSelector).",
        "type": "object",
        "additionalProperties": {"type": "string"},
        "default": {"nvidia.com/gpu.present": "true"},
    }
    variables["gpu_limit"] = {
        "title": "GPU Limit",
        "description": f"GPUs the flow's container gets (resources.limits[{GPU_RESOURCE!r}]).",
        "type": "integer",
        "minimum": 0,
        "default": 1,
    }
    variables["namespace"]["default"] = NAMESPACE
    variables["image"]["default"] = IMAGE
    variables["env"]["default"] = {"LORAGATE_VALIDATION_DEVICE": "cuda", "LORAGATE_SECRETS_DIR": SECRETS_PATH}

    job = template["job_configuration"]["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    for key in ("parallelism", "completions"):
        if key in pod:
            job["spec"][key] = pod.pop(key)
    pod["nodeSelector"] = "{{ node_selector }}"
    pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    pod["volumes"] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": MODELS_CLAIM, "readOnly": True}},
        {"name": "pool-secrets", "secret": {"secretName": POOL_SECRET, "defaultMode": 0o400}},
    ]

    container = next(c for c in pod["containers"] if c["name"] == FLOW_CONTAINER)
    container["resources"]["limits"][GPU_RESOURCE] = "{{ gpu_limit }}"
    container["envFrom"] = [{"configMapRef": {"name": CONFIG_MAP}}, {"secretRef": {"name": ENV_SECRET}}]
    container["volumeMounts"] = [
        {"name": "models", "mountPath": MODELS_PATH, "readOnly": True},
        {"name": "pool-secrets", "mountPath": SECRETS_PATH, "readOnly": True},
    ]
    return template


def render(template: dict[str, Any]) -> str:
    return json.dumps(template, indent=2) + "\n"


def main() -> None:
    sys.stdout.write(render(gpu_pool_template()))


if __name__ == "__main__":
    main()
