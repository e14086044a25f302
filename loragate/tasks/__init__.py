"""Heavy work as plain functions (shadow validation, later replica control and probes),
with thin Prefect ``@task`` wrappers beside them. Imports only ``registry``."""
