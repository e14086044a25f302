"""The SQL registry: tables (``schema``), Alembic migrations (``migrate``, ``migrations/``),
the shared database object (``database``) and one repository per entity. Private to
``registry/``: the layers above reach it only through ``Registry``."""
