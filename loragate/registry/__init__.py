"""loragate's domain, in rooms a reader can name:

- ``rules/``    pure rules: lifecycle, canary judgement, fleet planning, permissions, names
- ``intake/``   what comes in: manifest, bundle, weights, binding, catalog, golden sets
- ``records/``  what the registry hands back: versions, runs, reports
- ``storage/``  bytes at rest: artifacts, scratch, signing, resolver index files
- ``db/``       the SQL store: schema, migrations, one repository per entity
- ``service/``  ``Registry``, composed by concern: the only API above ``registry/``
- ``render/``   evidence for people: markdown and table rows
- ``errors``, ``settings``: typed errors with codes; configuration
- ``retrying``: the retry policy, and which failures are worth another try, once per kind
- ``progress``: the one-line-per-step callback long operations report through
- ``fan_out``: the same work on many replicas at once, every outcome handed back
- ``digests``: content digests, the patterns of commits and digests, canonical JSON -- what
  intake names content with, and storage and service check it by

Nothing here imports Prefect or the layers above (tasks, flows, cli).
"""
