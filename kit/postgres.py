"""The Postgres server the tests and benchmarks make databases on: its admin URL, and
creating, naming and dropping databases on it.

``LORAGATE_TEST_PG`` points the tests and benchmarks at another server than the local one.
"""

from __future__ import annotations

import os

PG_ADMIN_URL = os.environ.get("LORAGATE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def admin_engine():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def pg_url(db: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN_URL).set(database=db).render_as_string(hide_password=False)


def drop_database(admin, name: str) -> None:
    from sqlalchemy import text

    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
