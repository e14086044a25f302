"""The product's processes on one machine: vLLM replicas and their clients, the local Prefect
server and its workers.

What ``loragate replicas up``, ``make demo``, the tests and the benchmarks start and stop; the
warm worker also runs in each Kubernetes worker pod (``infra/k8s/prefect-workers.yaml``). What
deploys -- the Kubernetes manifests, the vLLM plugin -- is the repository's ``infra/``, outside
the wheel.
"""
