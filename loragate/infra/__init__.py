"""Running the product's processes: vLLM replicas and their clients, the local Prefect server and its workers."""
