"""infra/k8s/'s Prefect workers, offline: a worker of the right kind per pool of prefect.yaml,
each pool's flow runs holding its own Secret and no other, the signing role split between the
gpu pool (the key) and the canary pool (the token alone), and flow runs that beat."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loragate.local.pipeline import POOLS
from loragate.local.prefect_local import HEARTBEAT_ENV
from tests.support.k8s import (
    GPU,
    K8S,
    NAMESPACE,
    POOL_ROLES,
    SECRETS_PATH,
    arg_after,
    container,
    env_of,
    load_documents,
    no_network,  # noqa: F401  (an autouse fixture: nothing here touches the network)
    objects,
    prefect_yaml,
    render_gpu_job,
    secrets_read_by,
    vllm_statefulsets,
)

# -- the workers -----------------------------------------------------------------------------


WARM_WORKER = ["python", "-m", "loragate.local.warm_worker"]


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


def test_workers_take_the_api_url_from_the_config_map_and_the_api_credential_from_their_pools_env_secret():
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
        pool = arg_after(c["command"], "--pool")
        assert env["PREFECT_API_AUTH_STRING"]["valueFrom"]["secretKeyRef"] == {
            "name": f"loragate-{pool}-env",
            "key": "PREFECT_API_AUTH_STRING",
        }, name
        # its role's database URL is a file of its pool's Secret: none in the environment
        assert "LORAGATE_DATABASE_URL" not in env, name
        literal_secrets = [
            n
            for n, e in env.items()
            if "value" in e
            and n != "LORAGATE_SECRETS_DIR"  # a path: the secrets are the files there
            and any(w in n for w in ("TOKEN", "PASSWORD", "SECRET", "DATABASE_URL"))
        ]
        assert literal_secrets == [], name
        assert "requests" in c["resources"] and "limits" in c["resources"], name


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


def test_only_the_pools_that_switch_replicas_are_given_the_replicas_admin_key():
    readme = (K8S / "README.md").read_text()
    holders = set()
    for pool in POOL_ROLES:
        after = readme[readme.index(f"create secret generic loragate-{pool} ") :]
        if "--from-file=replica-admin-key=" in after[: after.index("kubectl")]:
            holders.add(pool)
    assert holders == {"canary", "release", "fleet"}


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
    canary, release (promote, rollback) and fleet (reconcile). Not gpu: validation writes to
    scratch space, and the pod with the signing key writes nothing the replicas load."""
    pods = {
        pool: (objects("Deployment")[f"prefect-worker-{pool}"]["spec"]["template"]["spec"], None)
        for pool in ("canary", "release", "fleet")
    }
    return {pool: (pod, next(c for c in pod["containers"] if c["name"] == "worker")) for pool, (pod, _) in pods.items()}


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


# -- one database user per pool, the owner for migrations only -------------------------------

OWNER_SECRET = "loragate-migrations"  # the database owner's URL
MIGRATIONS = "Job/loragate-migrate"


def own_secrets(pool: str) -> set[str]:
    """A pool's Secrets: its files (token, database URL, key) and its env (the API credential)."""
    return {f"loragate-{pool}", f"loragate-{pool}-env"}


def every_pod() -> dict[str, dict[str, Any]]:
    """Kind/name -> pod spec of every pod infra/k8s/ makes, the gpu pool's flow-run Job and
    the gpu-warm alternative included."""
    pods = {
        f"{kind}/{name}": w["spec"]["template"]["spec"]
        for kind in ("Deployment", "StatefulSet", "Job")
        for name, w in objects(kind).items()
    }
    for _, doc in load_documents([K8S / "gpu-warm" / "prefect-worker-gpu.yaml"]):
        if doc["kind"] == "Deployment":
            pods[f"Deployment/{doc['metadata']['name']}@gpu-warm"] = doc["spec"]["template"]["spec"]
    pods["Job/gpu-flow-run"] = render_gpu_job({})["spec"]["template"]["spec"]
    return pods


def pool_of(pod_name: str) -> str | None:
    name = pod_name.split("/", 1)[1].split("@")[0]
    if name == "gpu-flow-run":
        return "gpu"
    return name.removeprefix("prefect-worker-") if name.startswith("prefect-worker-") else None


def separation_breaches(pods: dict[str, dict[str, Any]]) -> list[str]:
    """What breaks one database user per pool: a pool's pod reading a Secret not its pool's,
    any pod but the migrations Job reading the owner's, a Secret of files taken with envFrom
    (each key an environment variable), a database URL in the environment of a pod that is
    not the migrations Job."""
    breaches = []
    all_pools = {s for pool in POOL_ROLES for s in own_secrets(pool)}
    for name, pod in pods.items():
        read, pool = secrets_read_by(pod), pool_of(name)
        if name == MIGRATIONS:
            breaches += [f"{name} reads {sorted(read)}"] if read != {OWNER_SECRET} else []
        elif pool is not None:
            breaches += [f"{name} reads {sorted(read - own_secrets(pool))}"] if read - own_secrets(pool) else []
        elif read & (all_pools | {OWNER_SECRET}):
            breaches.append(f"{name} reads {sorted(read & (all_pools | {OWNER_SECRET}))}")
        for c in pod["containers"]:
            files = [s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s]
            breaches += [f"{name} envFrom {s}" for s in files if not s.endswith("-env")]
            env = c.get("env") if isinstance(c.get("env"), list) else []
            if name != MIGRATIONS and any(e["name"] == "LORAGATE_DATABASE_URL" for e in env):
                breaches.append(f"{name} has LORAGATE_DATABASE_URL in its environment")
    return breaches


def test_every_pod_reads_only_its_pools_secrets_and_only_the_migrations_job_the_owners_url():
    pods = every_pod()
    assert separation_breaches(pods) == []
    assert {pool_of(name) for name in pods} >= set(POOL_ROLES)  # every pool's pods were checked
    assert [n for n, pod in pods.items() if OWNER_SECRET in secrets_read_by(pod)] == [MIGRATIONS]
    job = objects("Job")["loragate-migrate"]
    assert container(job, "migrate")["command"] == ["loragate", "init"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def _add_env_from(pod_name: str, secret: str):
    return lambda pods: (
        pods[pod_name]["containers"][0].setdefault("envFrom", []).append({"secretRef": {"name": secret}})
    )


def _add_volume(pod_name: str, secret: str):
    return lambda pods: pods[pod_name]["volumes"].append({"name": "x", "secret": {"secretName": secret}})


def _add_env(pod_name: str, secret: str, var: str = "LORAGATE_DATABASE_URL"):
    ref = {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}}
    return lambda pods: pods[pod_name]["containers"][0].setdefault("env", []).append(ref)


MUTATIONS = {
    "a worker envFrom the owner's Secret": _add_env_from("Deployment/prefect-worker-fleet", OWNER_SECRET),
    "a worker given the owner's URL as a variable": _add_env("Deployment/prefect-worker-release", OWNER_SECRET),
    "a worker mounting another pool's Secret": _add_volume("Deployment/prefect-worker-fleet", "loragate-release"),
    "the gpu Job envFrom its Secret of files": _add_env_from("Job/gpu-flow-run", "loragate-gpu"),
    "the warm gpu worker reading the canary's": _add_env(
        "Deployment/prefect-worker-gpu@gpu-warm", "loragate-canary-env", "PREFECT_API_AUTH_STRING"
    ),
    "a replica reading a pool's Secret": _add_volume("StatefulSet/vllm-production", "loragate-fleet"),
    "the migrations Job reading a pool's Secret": _add_volume(MIGRATIONS, "loragate-fleet"),
    "a database URL in a worker's environment": _add_env("Deployment/prefect-worker-intake", "loragate-intake-env"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_manifest_that_breaks_pool_separation_is_caught(mutation):
    pods = copy.deepcopy(every_pod())
    MUTATIONS[mutation](pods)
    assert separation_breaches(pods) != [], mutation


def test_the_readme_gives_each_pool_its_roles_database_user_and_no_pool_an_admin_token():
    readme = (K8S / "README.md").read_text()
    for pool, role in POOL_ROLES.items():
        after = readme[readme.index(f"create secret generic loragate-{pool} ") :]
        created = after[: after.index("kubectl", 1)]
        assert f"--from-file=token-{role}=" in created, pool
        assert f"--from-literal=database-url='postgresql://loragate_{role}:" in created, pool
        assert "token-admin" not in created and "loragate_admin" not in created, pool
        env = readme[readme.index(f"create secret generic loragate-{pool}-env ") :].splitlines()[0]
        assert "--from-literal=PREFECT_API_AUTH_STRING=" in env and env.count("--from-") == 1, pool
    assert "token-admin" not in readme


def test_the_gpu_pools_pods_mount_no_adapter_volume():
    """They hold the signing key, and a Job's image and command are job variables: nothing
    they could write may be what the replicas load."""
    for name, pod in every_pod().items():
        if pool_of(name) == "gpu":
            claims = {
                v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v
            }
            assert "loragate-adapters" not in claims, name
