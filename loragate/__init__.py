"""loragate: a registry and promotion pipeline for LoRA adapters served by vLLM.

Four layers, each importing only those below it: ``registry`` (the store and its rules),
``tasks`` (plain functions plus thin Prefect wrappers), ``flows`` (orchestration only) and
``cli`` (the outermost face). ``local`` starts and talks to the processes the product runs
on one machine: vLLM replicas, the Prefect server and its workers.
"""
