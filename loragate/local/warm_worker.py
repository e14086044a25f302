"""A worker whose flow runs start where the imports are already paid.

A process worker starts a Python process per flow run: on this machine 2-4 s of imports
for a gate whose own work is a few database reads and replica calls -- and 10-20 s when
two cores are busy (issue 18). ``WarmWorker`` polls its pool like any worker, claims a run
the same way (Prefect's Pending proposal, so two workers never run one run), and runs the
run's flow in a thread of its own long-lived process, where Prefect, the registry and the
fleet client were imported once. Everything else is the same flow run: the flow is the
deployment's entrypoint, the engine proposes Running and the final state, logs and
artifacts reach the UI, a suspended sign-off ends the thread (not the process) and its
resumed run is picked up again from the top.

What a thread cannot do that a process can: be killed. Cancelling a running flow run
leaves it to finish on its own deadlines (every wait a gate makes has one, and a validation
batch ends with its last adapter). One worker per pool and role as before: its process holds
that pool's secrets directory and nothing else, as the process worker's did. A pool whose
flows need heavy libraries names them (``--preload``): shadow validation's torch,
transformers and PEFT are imported once at the worker's start, not once per batch.

``python -m loragate.local.warm_worker --pool NAME [--limit N] [--name NAME] [--preload MODULE ...]
[--with-healthcheck]`` starts one (from the repository root: the entrypoints are relative
to it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import anyio.abc
from prefect.exceptions import Abort, InfrastructureNotAvailable, Pause
from prefect.flows import Flow
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker, ProcessWorkerResult

from loragate.local.prefect_local import FLOWS_PACKAGE, WORKER_LIMIT

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun, WorkPool
    from prefect.client.schemas.responses import WorkerFlowRunResponse

ROOT = Path(__file__).resolve().parents[2]


def module_of_entrypoint(entrypoint: str, package: str = FLOWS_PACKAGE) -> tuple[str, str]:
    """``loragate/flows/rollback.py:rollback_flow`` -> (``loragate.flows.rollback``, ``rollback_flow``): the
    deployment's entrypoint as the module this process imports once, not a file loaded
    again per run -- and only a module of ``package``: whoever can edit a deployment picks
    which of loragate's flows runs, never which code."""
    path, _, attribute = entrypoint.partition(":")
    if not path.endswith(".py") or not attribute.isidentifier() or Path(path).is_absolute() or ".." in Path(path).parts:
        raise ValueError(f"entrypoint {entrypoint!r} is not a module path under the repository")
    module = ".".join(Path(path).with_suffix("").parts)
    if not module.startswith(package + "."):
        raise ValueError(f"entrypoint {entrypoint!r} is outside {package!r}, the package whose flows this worker runs")
    return module, attribute


class WarmWorker(ProcessWorker):
    """A worker of a process pool whose flow runs are threads of its own process."""

    # a type of its own: registered as "process" it would replace Prefect's process worker
    # in any process that imports this module
    type = "loragate-warm"
    _description = "Runs a pool's short gates in threads of one long-lived, already-imported process."
    _display_name = "Warm (loragate)"

    def __init__(self, *args: Any, flows_package: str = FLOWS_PACKAGE, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flows_package = flows_package
        self._flows: dict[str, Flow[..., Any]] = {}
        self._flows_lock = threading.Lock()
        # runs whose thread has not returned yet: a suspended run's thread winds down after
        # its state is recorded, and its resumed run can be scheduled again before then
        self._in_threads: set[UUID] = set()

    def flow_for_entrypoint(self, entrypoint: str) -> Flow[..., Any]:
        with self._flows_lock:
            if entrypoint not in self._flows:
                module, attribute = module_of_entrypoint(entrypoint, self.flows_package)
                found = getattr(importlib.import_module(module), attribute, None)
                if not isinstance(found, Flow):
                    raise ValueError(f"entrypoint {entrypoint!r} names no flow")
                self._flows[entrypoint] = found
            return self._flows[entrypoint]

    async def _flow_of(self, flow_run: FlowRun, configuration: ProcessJobConfiguration) -> Flow[..., Any]:
        if flow_run.deployment_id is None:
            raise ValueError(f"flow run {flow_run.id} has no deployment: a warm worker runs deployments' runs only")
        # the deployment as Prefect's worker read it to build this run's configuration: one
        # API call less between a run's creation and its start, each of them a second or more
        # on a server whose cores busy replicas share (docs/benchmarks/fleet.md#a-rollback-through-prefect)
        deployment = configuration._related_objects.get("deployment")
        if deployment is None or deployment.id != flow_run.deployment_id:
            deployment = await self.client.read_deployment(flow_run.deployment_id)
        if not deployment.entrypoint:
            raise ValueError(f"deployment {deployment.name!r} has no entrypoint")
        return await anyio.to_thread.run_sync(self.flow_for_entrypoint, deployment.entrypoint)

    def _record_work_pool_snapshot(self, work_pool: WorkPool) -> None:
        # its pools are process pools (one job template, the same deployments): not the
        # "type mismatch" Prefect warns about
        if work_pool.type == ProcessWorker.type:
            work_pool = work_pool.model_copy(update={"type": self.type})
        super()._record_work_pool_snapshot(work_pool)

    async def _submit_scheduled_flow_runs(self, flow_run_response: list[WorkerFlowRunResponse]) -> list[FlowRun]:
        # Prefect's worker takes a limiter slot per run id and dies on a second one for the
        # same id; a run still winding down in its thread is left for the next poll
        ready = [entry for entry in flow_run_response if entry.flow_run.id not in self._in_threads]
        return await super()._submit_scheduled_flow_runs(ready)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        flow = await self._flow_of(flow_run, configuration)
        identifier = f"{os.getpid()}:{flow_run.id}"
        if task_status is not None:
            task_status.started(identifier)  # type: ignore[arg-type]  # recorded as the run's infrastructure id
        self._in_threads.add(flow_run.id)
        try:
            status_code = await anyio.to_thread.run_sync(run_in_this_thread, flow, flow_run, abandon_on_cancel=False)
        finally:
            # no await between here and the worker releasing the run's limiter slot
            self._in_threads.discard(flow_run.id)
        return ProcessWorkerResult(status_code=status_code, identifier=identifier)

    async def kill_infrastructure(
        self, infrastructure_pid: str, configuration: ProcessJobConfiguration, grace_seconds: int = 30
    ) -> None:
        raise InfrastructureNotAvailable(
            f"flow run {infrastructure_pid} is a thread of a warm worker: it ends on its own deadlines"
        )


def run_in_this_thread(flow: Flow[..., Any], flow_run: FlowRun) -> int:
    """Run ``flow`` for ``flow_run`` here; the exit status a flow-run process would have
    had (0 for a run that completed, failed, suspended or was aborted by the server: its
    state is already recorded; 1 for an engine error, which the worker records as a crash)."""
    from prefect.flow_engine import run_flow
    from prefect.logging.loggers import flow_run_logger

    try:
        run_flow(flow, flow_run=flow_run, return_type="state", error_logger=flow_run_logger(flow_run=flow_run))
    except (Abort, Pause):
        return 0
    except Exception:
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loragate.local.warm_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--pool", required=True)
    parser.add_argument("--limit", type=int, default=WORKER_LIMIT, help="flow runs at once (threads)")
    parser.add_argument("--name", default=None)
    parser.add_argument("--flows-package", default=FLOWS_PACKAGE, help="the package whose flows it runs")
    parser.add_argument("--with-healthcheck", action="store_true", help="serve /health (PREFECT_WORKER_WEBSERVER_*)")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE", help="import at start")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # deployments' entrypoints are relative to the repository root

    worker = WarmWorker(work_pool_name=args.pool, limit=args.limit, name=args.name, flows_package=args.flows_package)
    for module in args.preload:
        importlib.import_module(module)  # a module that does not import stops the worker here
    preload(worker, args.pool)
    asyncio.run(worker.start(with_healthcheck=args.with_healthcheck))


def preload(worker: WarmWorker, pool: str) -> None:
    """Import the flows of the pool's deployments before the first run asks for them: the
    first rollback after a start should not pay the imports either. One that fails to
    import is left to fail its own runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    try:
        with get_client(sync_client=True) as client:
            deployments = client.read_deployments(work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])))
    except Exception as exc:  # the API down at start: the runs import their flows themselves
        print(f"warm worker: could not list pool {pool!r}'s deployments to preload them: {exc}", flush=True)
        return
    for deployment in deployments:
        if not deployment.entrypoint:
            continue
        try:
            worker.flow_for_entrypoint(deployment.entrypoint)
        except Exception as exc:
            print(f"warm worker: {deployment.entrypoint} does not import: {exc}", flush=True)


if __name__ == "__main__":
    main()
