"""The benchmarks: each prints its result as JSON (progress on stderr) and measures against a
baseline or a peer in the same run. Run each as a module from the repository root::

    .venv/bin/python -m bench.<name> [--help]

The environment defaults below are set here, before any benchmark module (and the libraries
it imports) loads: nothing is downloaded, the model kit builds everything locally, and Great
Expectations sends no analytics. This module imports nothing but the standard library: the
MLflow peer (``bench.mlflow_peer``) imports this package in its own virtual environment.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
