"""infra/k8s/'s Prefect workers, offline: a worker of the right kind per pool of prefect.yaml,
each pool's flow runs holding its own Secret and no other, the signing role split between the
gpu pool (the key) and the canary pool (the token alone), and flow runs that beat."""

from __future__ import annotations

from typing import Any

from infra.pipeline import POOLS
from infra.prefect_local import HEARTBEAT_ENV
from tests.support.k8s import (
    GPU,
    K8S,
    NAMESPACE,
    POOL_ROLES,
    SECRETS_PATH,
    arg_after,
    container,
    env_of,
    no_network,  # noqa: F401  (an autouse fixture: nothing here touches the network)
    objects,
    prefect_yaml,
    render_gpu_job,
    vllm_statefulsets,
)

# -- the workers -----------------------------------------------------------------------------


WARM_WORKER = ["python", "-m", "infra.warm_worker"]


def test_each_prefect_yaml_pool_has_a_worker_of_the_right_kind_with_a_health_check():
    """The gpu pool's runs are Kubernetes Jobs; the short gates' pools run warm workers."""
    pools = {p["name"] for p in prefect_yaml()["definitions"]["pools"].values()}
    expected_kinds = {"gpu": "kubernetes", "intake": "warm", "canary": "warm", "release": "warm", "fleet": "warm"}
    workers = {}
    for name, deployment in objects("Deployment").items():
        command = container(deployment, "worker")["command"]
        if command[:3] == ["prefect", "worker", "start"]:
            workers[arg_after(command, "--pool")] = (name, command, arg_after(command, "--type"))
        elif command[:3] == WARM_WORKER:
            workers[arg_after(command, "--pool")] = (name, command, "warm")
    assert set(workers) == pools
    for pool, (name, command, kind) in workers.items():
        assert kind == expected_kinds[pool], name
        if kind == "warm":  # it imports at its start what the local pipeline's worker does
            preloaded = tuple(command[i + 1] for i, arg in enumerate(command) if arg == "--preload")
            assert preloaded == next(p for p in POOLS if p.name == pool).preload, name
        assert "--with-healthcheck" in command, name
        probe = container(objects("Deployment")[name], "worker")["livenessProbe"]["httpGet"]
        assert probe["path"] == "/health"
        ports = {p["name"]: p["containerPort"] for p in container(objects("Deployment")[name], "worker")["ports"]}
        assert ports.get(probe["port"], probe["port"]) == 8080


def test_workers_take_the_api_url_from_the_config_map_and_secrets_only_from_the_secret():
    for name, deployment in objects("Deployment").items():
        if not name.startswith("prefect-worker-"):
            continue
        c = container(deployment, "worker")
        env = env_of(c)
        from_config_map = {s["configMapRef"]["name"] for s in c.get("envFrom", []) if "configMapRef" in s}
        api_url = env.get("PREFECT_API_URL", {}).get("valueFrom", {}).get("configMapKeyRef", {})
        assert api_url.get("name") == "loragate-config" or "loragate-config" in from_config_map, name
        assert "PREFECT_API_URL" in objects("ConfigMap")["loragate-config"]["data"]
        # the Prefect server has API authentication on: every worker carries its credential
        assert env["PREFECT_API_AUTH_STRING"]["valueFrom"]["secretKeyRef"] == {
            "name": "loragate-secrets",
            "key": "PREFECT_API_AUTH_STRING",
        }, name
        for var in ("LORAGATE_DATABASE_URL",):
            if var in env:
                assert "value" not in env[var], f"{name}: {var} is a literal"
                assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "loragate-secrets", "key": var} | (
                    {"optional": True} if "optional" in env[var]["valueFrom"]["secretKeyRef"] else {}
                )
        literal_secrets = [
            n
            for n, e in env.items()
            if "value" in e
            and n != "LORAGATE_SECRETS_DIR"  # a path: the secrets are the files there
            and any(w in n for w in ("TOKEN", "PASSWORD", "SECRET", "DATABASE_URL"))
        ]
        assert literal_secrets == [], name
        assert "requests" in c["resources"] and "limits" in c["resources"], name
    release_env = env_of(container(objects("Deployment")["prefect-worker-release"], "worker"))
    assert "secretKeyRef" in release_env["LORAGATE_DATABASE_URL"]["valueFrom"]


def pool_pods() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, flow container) where each pool's flow runs run: the process pools' worker
    pods, and the gpu pool's Job pod."""
    found = {}
    for pool in POOL_ROLES:
        if pool == "gpu":
            pod = render_gpu_job({})["spec"]["template"]["spec"]
            found[pool] = (pod, next(c for c in pod["containers"] if c["name"] == "prefect-job"))
        else:
            pod = objects("Deployment")[f"prefect-worker-{pool}"]["spec"]["template"]["spec"]
            found[pool] = (pod, container(objects("Deployment")[f"prefect-worker-{pool}"], "worker"))
    return found


def test_each_pools_flow_runs_mount_that_pools_secret_and_no_other_and_hold_no_token_in_their_environment():
    """One role per pool: a pod mounts its own pool's Secret read-only where
    LORAGATE_SECRETS_DIR points, and no pod (worker, Job or replica) takes a token, key or
    Slack token as an environment variable."""
    pool_secrets = {f"loragate-{pool}" for pool in POOL_ROLES}
    for pool, (pod, flow_container) in pool_pods().items():
        mounted = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        assert {s["secretName"] for s in mounted.values()} == {f"loragate-{pool}"}, pool
        (volume, secret), *_ = mounted.items()
        assert secret.get("defaultMode") == 0o400, pool
        mount = next(m for m in flow_container["volumeMounts"] if m["name"] == volume)
        assert mount["mountPath"] == SECRETS_PATH and mount["readOnly"] is True, pool
        env = flow_container.get("env", [])
        env = {e["name"]: e.get("value") for e in env} if isinstance(env, list) else {}
        assert env.get("LORAGATE_SECRETS_DIR") == SECRETS_PATH, pool
    workloads = [*objects("Deployment").values(), *objects("StatefulSet").values()]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        if workload["metadata"]["name"].startswith("vllm"):
            assert not {v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])} & pool_secrets
        for c in pod["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            assert not names & {"LORAGATE_TOKEN", "LORAGATE_SLACK_TOKEN", "LORAGATE_SIGNING_KEY"}, c["name"]


def test_every_flow_run_beats_so_the_sweep_can_tell_a_dead_run_from_a_busy_one():
    config = objects("ConfigMap")["loragate-config"]["data"]
    assert config["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == HEARTBEAT_ENV["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
    for pool, (_, flow_container) in pool_pods().items():
        assert {"configMapRef": {"name": "loragate-config"}} in flow_container["envFrom"], pool


def test_the_canary_deployment_runs_with_the_signing_token_but_neither_the_key_nor_a_gpu():
    canary = next(d for d in prefect_yaml()["deployments"] if d["name"] == "canary")
    pool = canary["work_pool"]["name"]
    assert pool != "gpu" and POOL_ROLES[pool] == POOL_ROLES["gpu"] == "signing"
    assert not next(p for p in POOLS if p.name == pool).holds_signing_key
    pod, _ = pool_pods()[pool]
    assert not pod.get("nodeSelector")
    for c in pod["containers"]:
        assert GPU not in c["resources"].get("limits", {}), c["name"]
    # what the README has an operator put into that pool's Secret
    readme = (K8S / "README.md").read_text()
    after = readme[readme.index(f"create secret generic loragate-{pool} ") :]
    created = after[: after.index("kubectl")]
    assert "--from-file=token-signing=" in created and "signing-key.pem" not in created


def test_the_gpu_worker_may_run_and_watch_jobs_and_read_their_pods_in_its_namespace():
    role = objects("Role")["prefect-worker-gpu"]
    allowed = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    needed = {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
    needed |= {("", "pods", v) for v in ("get", "list", "watch")} | {("", "pods/log", "get")}
    needed |= {("", "events", v) for v in ("get", "list", "watch")}
    assert needed <= allowed
    binding = objects("RoleBinding")["prefect-worker-gpu"]
    assert binding["roleRef"]["name"] == "prefect-worker-gpu"
    worker = objects("Deployment")["prefect-worker-gpu"]
    sa = worker["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE} in binding["subjects"]
    # a namespaced Role cannot serve the observer's default cluster-wide watch
    env = env_of(container(worker, "worker"))
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"]["value"] == NAMESPACE


def writer_pods() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, flow container) of each pool whose flows write to the adapter volume:
    canary, release (promote, rollback), fleet (reconcile), and gpu (its Jobs)."""
    pods = {
        pool: (objects("Deployment")[f"prefect-worker-{pool}"]["spec"]["template"]["spec"], None)
        for pool in ("canary", "release", "fleet")
    }
    found = {
        pool: (pod, next(c for c in pod["containers"] if c["name"] == "worker")) for pool, (pod, _) in pods.items()
    }
    gpu_pod = render_gpu_job({})["spec"]["template"]["spec"]
    found["gpu"] = (gpu_pod, next(c for c in gpu_pod["containers"] if c["name"] == "prefect-job"))
    return found


def test_loragate_writes_bundles_where_the_replicas_read_them():
    """The flows that materialize write into the adapter dir the replicas were registered with."""
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        adapter_dir = env_of(c)["LORAGATE_ADAPTER_DIR"]["value"]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == adapter_dir)
        volume = next(v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert objects("PersistentVolumeClaim")[claim]["spec"]["accessModes"] == ["ReadWriteMany"], name
        for pool, (pod, flow_container) in writer_pods().items():
            claims = {
                v["name"]: v["persistentVolumeClaim"]["claimName"]
                for v in pod["volumes"]
                if "persistentVolumeClaim" in v
            }
            writer = next(m for m in flow_container["volumeMounts"] if claims.get(m["name"]) == claim)
            assert writer["mountPath"] == adapter_dir and not writer.get("readOnly", False), (name, pool)
