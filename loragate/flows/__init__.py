"""Prefect flows that only sequence tasks: register, shadow-validate, canary, promote, rollback."""
