"""The test and demo kit, kept out of the wheel: a tiny offline base model (basekit), toy
tenant tasks with their golden sets (tenant_tasks), adapters trained on them (modelkit), the
silent-failure corpus, tampering helpers and the demo that drives them; what the tests and
the benchmarks both use: the Postgres server they make databases on (postgres), HTTP faults
in front of a replica (http_faults), the processes of given flow runs (flow_processes); and
the fault injector of the test replicas' live split (replica_faults/, on their PYTHONPATH
only: no package)."""
