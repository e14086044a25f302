"""infra/k8s/'s vLLM replicas, offline: one canary and two production replicas, each on a GPU,
serving the base with LoRA on, their limits from the fleet ConfigMap, the resolver of their
role, and stable DNS names."""

from __future__ import annotations

import tomllib

from loragate.registry.settings import VLLM_LORA_RANKS
from tests.support.k8s import (
    GPU,
    ROOT,
    arg_after,
    container,
    env_of,
    no_network,  # noqa: F401  (an autouse fixture: nothing here touches the network)
    objects,
    vllm_statefulsets,
)

# -- the vLLM replicas -----------------------------------------------------------------------


def test_there_is_one_canary_replica_and_two_production_replicas_each_on_a_gpu():
    replicas = {}
    for name, statefulset in vllm_statefulsets().items():
        role = statefulset["spec"]["template"]["metadata"]["labels"]["loragate.dev/role"]
        replicas[role] = statefulset["spec"]["replicas"]
        resources = container(statefulset, "vllm")["resources"]
        assert resources["limits"][GPU] == 1, name
    assert replicas == {"canary": 1, "production": 2}


def test_vllm_lora_limits_come_from_the_fleet_config_map():
    fleet = objects("ConfigMap")["loragate-fleet"]["data"]
    assert int(fleet["max_lora_rank"]) in VLLM_LORA_RANKS
    assert int(fleet["max_cpu_loras"]) >= int(fleet["max_loras"]) >= 1
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        env = env_of(c)
        for flag, variable, key in (
            ("--max-lora-rank", "MAX_LORA_RANK", "max_lora_rank"),
            ("--max-loras", "MAX_LORAS", "max_loras"),
            ("--max-cpu-loras", "MAX_CPU_LORAS", "max_cpu_loras"),
        ):
            assert arg_after(c["args"], flag) == f"$({variable})", name
            assert env[variable]["valueFrom"]["configMapKeyRef"] == {"name": "loragate-fleet", "key": key}, name
    worker_env = env_of(container(objects("Deployment")["prefect-worker-release"], "worker"))
    assert worker_env["LORAGATE_MAX_LORA_RANK"]["valueFrom"]["configMapKeyRef"] == {
        "name": "loragate-fleet",
        "key": "max_lora_rank",
    }


def test_vllm_replicas_run_the_openai_server_of_the_base_with_lora_on():
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        assert c["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"], name
        assert arg_after(c["args"], "--model") == "/models/base"
        assert arg_after(c["args"], "--served-model-name") == "tiny-llama"
        assert arg_after(c["args"], "--port") == "8000"
        assert "--enable-lora" in c["args"]
        models = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
        assert models["readOnly"] is True


def test_vllm_replicas_are_ready_when_they_list_models_and_alive_while_healthy():
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in (("readinessProbe", "/v1/models"), ("livenessProbe", "/health")):
            get = c[probe]["httpGet"]
            assert get["path"] == path, f"{name} {probe}"
            assert ports.get(get["port"], get["port"]) == 8000, f"{name} {probe}"


def test_vllm_replicas_load_the_loragate_resolver_for_their_role():
    """As loragate/local/replica_config.py launches it: the plugin is enabled by its entry point's name and
    registers only when told the adapter dir and the role."""
    plugin = tomllib.loads((ROOT / "infra" / "vllm_plugin" / "pyproject.toml").read_text())
    entry_points = set(plugin["project"]["entry-points"]["vllm.general_plugins"])
    for name, statefulset in vllm_statefulsets().items():
        role = statefulset["spec"]["template"]["metadata"]["labels"]["loragate.dev/role"]
        env = {n: e.get("value") for n, e in env_of(container(statefulset, "vllm")).items()}
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1", name
        assert set(env["VLLM_PLUGINS"].split(",")) <= entry_points, name
        assert env["LORAGATE_ADAPTER_DIR"] == "/adapters", name
        assert env["LORAGATE_REPLICA_ROLE"] == role, name


def test_each_replica_pod_has_a_stable_dns_name_from_a_headless_service_of_its_role():
    services = objects("Service")
    for name, statefulset in vllm_statefulsets().items():
        service = services[statefulset["spec"]["serviceName"]]
        assert service["spec"]["clusterIP"] == "None", name
        pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        assert service["spec"]["selector"]["loragate.dev/role"] == pod_labels["loragate.dev/role"]
        assert [p["port"] for p in service["spec"]["ports"]] == [8000]


# -- the replicas obey only the fleet --------------------------------------------------------

REPLICA_SECRETS = "/var/run/secrets/loragate-replica"
FLEET_CONTROL = {"prefect-worker-canary", "prefect-worker-release", "prefect-worker-fleet"}


def test_vllm_replicas_guard_their_admin_api_with_a_key_and_read_the_registry_from_mounted_files():
    """The admin guard is on (then the live split), and its key and the registry's read-only
    URL are files of a Secret mounted read-only: no secret in the environment, only the
    directory's path."""
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        # the guard first: a request the split sees already passed it
        middleware = [c["args"][i + 1] for i, a in enumerate(c["args"]) if a == "--middleware"]
        assert middleware == ["loragate_resolver.admin_guard.AdminGuard", "loragate_resolver.traffic.TrafficSplit"]
        env = env_of(c)
        assert env["LORAGATE_BASE_MODEL_NAME"]["value"] == arg_after(c["args"], "--served-model-name"), name
        assert env["LORAGATE_REPLICA_SECRETS_DIR"]["value"] == REPLICA_SECRETS, name
        assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in env.values()), name
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == REPLICA_SECRETS)
        assert mount["readOnly"] is True, name
        volume = next(v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "loragate-replica", name
        assert volume["secret"]["defaultMode"] == 0o400, name


def test_only_the_fleet_control_workers_and_labelled_inference_clients_reach_the_replicas():
    policy = objects("NetworkPolicy")["vllm-replicas"]["spec"]
    for name, statefulset in vllm_statefulsets().items():
        pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items(), name
    assert policy["policyTypes"] == ["Ingress"]
    workers = objects("Deployment")
    sources = []
    for rule in policy["ingress"]:
        assert [(p["port"], p["protocol"]) for p in rule["ports"]] == [(8000, "TCP")]
        sources += rule["from"]
    [fleet_control, clients] = sources
    [expression] = fleet_control["podSelector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("app.kubernetes.io/name", "In")
    assert set(expression["values"]) == FLEET_CONTROL
    for worker in FLEET_CONTROL:  # the names select the pool workers' pods
        assert workers[worker]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == worker
    assert clients["podSelector"]["matchLabels"] == {"loragate.dev/inference-client": "true"}
