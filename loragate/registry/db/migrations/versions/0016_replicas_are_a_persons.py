"""Replicas are a person's to add, and hot pins are bounded by the database.

Every evaluation and the traffic watch read a production replica's figures, and every
replica is sent the fleet's key: who adds one decides what the fleet believes. So adding,
removing or changing a replica is the admin role's (a person's token, audited), never the
fleet pool's: ``loragate_fleet`` loses INSERT and DELETE on ``replicas`` (0010 gave them for
``fleet add`` and ``replicas up``, which now take an admin token). It still reads them, and
reconciles what they serve.

The hot-pin limit is written by ``loragate init`` from ``LORAGATE_HOT_PINS`` into
``registry_limits.hot_pins``, and the pin rules trigger of 0014 holds every role's user to
it, whoever writes the pin: a hot pin goes in only while the base's hot pins stay within
the least of that limit and its smallest production replica's ``max_loras`` - 1 (no hot pin
without a production replica), counted under the advisory lock every replacement of the hot
set takes, so two writers at once cannot both pass. A person's pin (``operator``) is not
bounded here (the application leaves hot pins only the room a person's leave, and counts
warm copies too: it is stricter). The owner is not limited, as in 0009-0014.

SQLite has no users: the column is added, and the application holds the rule. The downgrade
puts back the grants and 0014's trigger function, and drops the column.

Revision ID: 0016
Revises: 0015
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# LORAGATE_HOT_PINS's default (settings.py), the limit before loragate init writes the setting
DEFAULT_HOT_PINS = 10
# the advisory lock key db/pins.py takes around a replacement of the hot set
HOT_PINS_LOCK = 0x6C6F726167617465

ROLES = ("training", "signing", "activation", "admin", "fleet")
PINNED = "SET search_path = pg_catalog, pg_temp"
A_LORAGATE_ROLE = " OR ".join(f"pg_catalog.pg_has_role(current_user, 'loragate_{r}', 'USAGE')" for r in ROLES)
# the owner, and a superuser (who holds every role), are not limited
UNLIMITED = f"NOT ({A_LORAGATE_ROLE}) OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)"

PIN_RULES = f"""
CREATE OR REPLACE FUNCTION public.loragate_pin_rules() RETURNS trigger LANGUAGE plpgsql {PINNED} AS $$
DECLARE
  v_base text;
  v_limit integer;
  v_pinned integer;
BEGIN
  IF {UNLIMITED} THEN
    RETURN coalesce(NEW, OLD);
  END IF;
  IF NOT pg_catalog.pg_has_role(current_user, 'loragate_admin', 'USAGE') THEN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.source IS DISTINCT FROM 'hot' THEN
      RAISE EXCEPTION 'the % pin of % is a person''s: only the admin role changes or removes it', OLD.source,
        OLD.adapter_name USING ERRCODE = '42501';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.source IS DISTINCT FROM 'hot' THEN
      RAISE EXCEPTION 'an adapter is pinned as % only by the admin role: % may pin hot adapters only', NEW.source,
        current_user USING ERRCODE = '42501';
    END IF;
  END IF;
  -- a hot pin, whoever writes it: within the base's limit, counted under the lock every
  -- replacement of the hot set takes, so two writers at once cannot both pass
  -- (an insert that meets a pin already there adds none: ON CONFLICT DO NOTHING, or the key's refusal)
  IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.source = 'hot' THEN
    PERFORM pg_catalog.pg_advisory_xact_lock({HOT_PINS_LOCK});
    IF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM public.adapter_pins p WHERE p.adapter_name = NEW.adapter_name) THEN
      RETURN NEW;
    END IF;
    v_base := (SELECT a.base FROM public.adapters a WHERE a.name = NEW.adapter_name);
    v_limit := least(
      coalesce((SELECT l.hot_pins FROM public.registry_limits l WHERE l.id = 1), 0),
      coalesce((SELECT pg_catalog.min(r.max_loras) - 1 FROM public.replicas r
                WHERE r.base_model_id = v_base AND r.role = 'production'), 0));
    v_pinned := (SELECT pg_catalog.count(*) FROM public.adapter_pins p JOIN public.adapters a ON a.name = p.adapter_name
                 WHERE a.base = v_base AND p.source = 'hot' AND p.adapter_name IS DISTINCT FROM NEW.adapter_name);
    IF v_pinned + 1 > v_limit THEN
      RAISE EXCEPTION 'base % has % hot pins and a limit of %: % is not pinned hot', v_base, v_pinned, v_limit,
        NEW.adapter_name USING ERRCODE = '42501';
    END IF;
  END IF;
  RETURN coalesce(NEW, OLD);
END $$
"""


def _pin_rules_of_0014() -> str:
    path = Path(__file__).with_name("0014_adapter_pins.py")
    spec = importlib.util.spec_from_file_location("loragate_migration_0014", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PIN_RULES.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    op.add_column("registry_limits", sa.Column("hot_pins", sa.Integer(), nullable=True))
    # the setting's default until init writes the operator's, as 0012 wrote the cap's
    op.execute(f"UPDATE registry_limits SET hot_pins = {DEFAULT_HOT_PINS}")
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("REVOKE INSERT, DELETE ON replicas FROM loragate_fleet")
    op.execute(PIN_RULES)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_pin_rules_of_0014())
        op.execute("GRANT INSERT, DELETE ON replicas TO loragate_fleet")
    op.drop_column("registry_limits", "hot_pins")
