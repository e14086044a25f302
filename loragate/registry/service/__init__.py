"""The registry's operations, one module per concern, composed into ``Registry``:

- ``base``        the stores, the settings, who is calling (authentication, authorization)
- ``reading``     versions, adapters, pointers, the audit log
- ``intake``      pinning bases, registering bundles
- ``lifecycle``   the pointer move (a context manager running its replicas' switch), promote, rollback
- ``signing``     signing a validated version, verifying the signature production relies on
- ``validation``  golden sets, validation runs, the weight scan's review
- ``access``      tokens and signing keys
- ``fleet``       replicas, expected outputs, materializing a bundle for a replica
- ``residency``   how many adapters a base's replicas must hold, and their memory
- ``pins``        adapters pinned on the production replicas: a person's, and the hot ones
- ``canary``      canary windows, observations, sign-offs
- ``gc``          what crashed writes left behind
"""

from loragate.registry.service.gc import GcReport
from loragate.registry.service.intake import RegisterResult
from loragate.registry.service.lifecycle import PointerMove
from loragate.registry.service.registry import Registry

__all__ = ["GcReport", "PointerMove", "RegisterResult", "Registry"]
