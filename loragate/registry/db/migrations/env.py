"""Alembic environment: run with a connection handed in by loragate.registry.db.migrate."""

from alembic import context

from loragate.registry.db.schema import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through loragate.registry.db.migrate (loragate init), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
