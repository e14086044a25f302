"""loragate's domain: manifests, the base catalog, the artifact and SQL stores, lifecycle rules.

Nothing here imports Prefect or the layers above (tasks, flows, cli).
"""
