"""Shadow validation: prove an adapter really works against its pinned base.

The adapter is loaded onto the exact base it is bound to (re-verifying the base's
digests, with the manifest's bitsandbytes setup and eager attention) and run on its
golden set; it passes only if every check in ``checks.CHECKS`` holds. The rooms:

* ``session``  -- the model session: load a base once, attach or hot-swap adapters, generate;
* ``checks``   -- one function per check, and the table of them;
* ``policy``   -- what the gate demands, from the settings;
* ``runner``   -- one adapter, a batch on one base, registered versions recorded end to end;
* ``prefect_tasks`` -- the thin Prefect ``@task`` wrapper (the only module importing Prefect).

The report is ``loragate.registry.records.reports.ValidationReport``: the registry stores it.
"""

from loragate.tasks.validation.checks import CHECKS, AdapterUnderTest, Reference
from loragate.tasks.validation.policy import ValidationPolicy
from loragate.tasks.validation.runner import validate_bundle, validate_group, validate_versions

__all__ = [
    "CHECKS",
    "AdapterUnderTest",
    "Reference",
    "ValidationPolicy",
    "validate_bundle",
    "validate_group",
    "validate_versions",
]
