"""Deployment artifacts, kept out of the wheel: Kubernetes manifests (k8s/) and the vLLM
resolver plugin, a package of its own that runs inside the replicas (vllm_plugin/)."""
