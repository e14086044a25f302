"""Helpers the tests share, one module per concern; ``tests/conftest.py`` keeps the fixtures.
What the benchmarks use too -- the Postgres server (``kit.postgres``), the HTTP faults
(``kit.http_faults``), the processes of flow runs (``kit.flow_processes``) -- is the kit's.

* ``commands``: the role each ``loragate`` command needs, tokens for every role, and
  runners of the CLI (in process or the installed command) that present them.
* ``registries``: registries for tests that are not about the store, validating and signing
  without the gate, and looking under the registry (raw SQL, blobs, audit rows, snapshots).
* ``prefect_env``: a real Prefect server for the session (the ``prefect_server`` fixture).
* ``slack``: a recording Slack Web API (the ``slack`` fixture).
* ``fleet``: a registry with two validated, signed versions of one adapter for tests on
  real replicas, validated once per session.
* ``browser``: answering a paused flow run's approval form in the Prefect UI.
* ``moves``: promotions and rollbacks through the fleet-switching move, the one public path.
* ``pointer_story``: the story an adapter's audit log must tell, its pointer moves replayed.
* ``verdicts``: one canary window and its figures, fixed, for the verdict tests.
* ``bundle_mutations``, ``bad_weights``, ``bad_metadata``: the bad-input table's rows.
* ``docs``: what the docs tests read -- pages with their snippets, headings and their ids,
  references to a heading, the code layout's rows.
"""
