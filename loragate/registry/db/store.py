"""The SQL store: one repository per entity over one shared ``Database``, composed the
way Prefect's client composes its per-entity mixins -- a reader finds how a canary window
is stored in ``db/canary.py``, not in a file of everything.

    store.catalog       pinned base models                      (db/catalog.py)
    store.versions      adapter versions                        (db/versions.py)
    store.pointers      adapters, pointers, claims              (db/pointers.py)
    store.fleet         replicas                                (db/fleet.py)
    store.pins          adapters pinned on production replicas  (db/pins.py)
    store.access        tokens, keys, signatures                (db/access.py)
    store.golden        golden sets                             (db/validation.py)
    store.validation    validation runs                         (db/validation.py)
    store.canary        windows and their sign-off claims       (db/canary.py)
    store.canary_verdicts  observations and the verdict's moves (db/canary_verdicts.py)
    store.canary_share  a window's share of live requests       (db/canary_share.py)
    store.approvals     approval codes issued and redeemed      (db/approvals.py)
    store.sign_offs     the codes production moves spend        (db/sign_offs.py)
    store.limits        the limits the database's rules read    (db/limits.py)
    store.audit         the audit log, gc references            (db/audit.py)
    store.progress      versions waiting between gates          (db/progress.py)
"""

from __future__ import annotations

from sqlalchemy.engine import URL, Engine

from loragate.registry.db.access import AccessRepository
from loragate.registry.db.approvals import ApprovalRepository
from loragate.registry.db.audit import AuditRepository
from loragate.registry.db.canary import CanaryRepository
from loragate.registry.db.canary_share import CanaryShareRepository
from loragate.registry.db.canary_verdicts import CanaryVerdictRepository
from loragate.registry.db.catalog import CatalogRepository
from loragate.registry.db.database import DEFAULT_LIMITS, Database, SessionLimits, make_engine
from loragate.registry.db.fleet import FleetRepository
from loragate.registry.db.limits import LimitsRepository
from loragate.registry.db.pins import PinRepository
from loragate.registry.db.pointers import PointerRepository
from loragate.registry.db.progress import ProgressRepository
from loragate.registry.db.sign_offs import SignOffRepository
from loragate.registry.db.validation import GoldenSetRepository, ValidationRunRepository
from loragate.registry.db.versions import VersionRepository


class SqlStore:
    def __init__(self, engine: Engine):
        self.db = Database(engine)
        self.catalog = CatalogRepository(self.db)
        self.versions = VersionRepository(self.db)
        self.pointers = PointerRepository(self.db)
        self.fleet = FleetRepository(self.db)
        self.pins = PinRepository(self.db)
        self.access = AccessRepository(self.db)
        self.golden = GoldenSetRepository(self.db)
        self.validation = ValidationRunRepository(self.db)
        self.canary = CanaryRepository(self.db)
        self.canary_share = CanaryShareRepository(self.db, self.canary)
        self.canary_verdicts = CanaryVerdictRepository(self.db, self.canary)
        self.approvals = ApprovalRepository(self.db, self.canary)
        self.sign_offs = SignOffRepository(self.db, self.approvals)
        self.limits = LimitsRepository(self.db)
        self.audit = AuditRepository(self.db)
        self.progress = ProgressRepository(self.db)

    @classmethod
    def from_url(cls, url: URL, limits: SessionLimits = DEFAULT_LIMITS) -> SqlStore:
        return cls(make_engine(url, limits))

    @property
    def engine(self) -> Engine:
        return self.db.engine

    def upgrade_schema(self) -> None:
        self.db.upgrade_schema()

    def check_schema(self) -> None:
        """Raises:
        InvalidInput: NOT_INITIALIZED when the schema is missing or outdated.
        Unavailable: DATABASE_UNAVAILABLE when the database cannot be reached.
        """
        self.db.check_schema()

    def close(self) -> None:
        self.db.close()
