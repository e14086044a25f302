"""The production shape beyond one machine: Kubernetes manifests and the ``gpu`` work pool's
base job template (README.md here)."""
