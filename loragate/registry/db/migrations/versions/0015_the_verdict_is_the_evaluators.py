"""The canary verdict is the evaluator's: observations and the moves they decide are written
only through one function, under a database role of its own.

A window's verdict decides who is served what and is what a person reads before signing a
promotion off. Until now every user that may move canary windows (``signing``, the canary
pool's; ``activation``, the release pool's) could INSERT ``canary_observations`` (the latest
one's evidence seeds the next look: an error test could be reset) and UPDATE a window from
``open`` to ``ready`` (an open window is the only kind the evaluation looks at: a failing
canary left the watch and was offered for sign-off). On Postgres now:

- ``loragate_evaluator`` is a role nobody logs in as and nobody is a member of. It owns
  ``loragate_record_observation``, a SECURITY DEFINER function (search path pinned, names
  qualified, as 0010 requires) and holds the only INSERT on ``canary_observations``. The
  function stores one observation of an *open* window and makes the move its verdict
  decides: ``ready`` (reason given, ``closed_at`` none) or ``undecided`` (closed now), and
  nothing for ``continue`` or ``rollback`` (a rollback's move is the withdrawal's, which may
  always take a canary away). EXECUTE belongs to ``loragate_activation`` alone, the role
  the evaluation runs as (``canary-evaluate`` on the ``release`` pool), and to the owner.
- every loragate role's INSERT on ``canary_observations`` is revoked; the window rules
  trigger refuses a role's move to ``ready`` or ``undecided``: only the function makes one,
  so neither is reachable without an observation the evaluator wrote in the same
  statement.
- a window's thresholds are fixed at opening from the settings: ``registry_limits`` gains
  ``canary_thresholds``, which ``loragate init`` (the owner's path) writes from the
  settings, and a role's INSERT takes them, whatever it wrote. Until init writes them (an
  install not re-initialised since this revision) the opener's stand.
- ``approval_flow_run_id`` (who waits for the sign-off) is written by ``activation`` only:
  ``signing`` loses that column's UPDATE.
- ``bucket_key`` (each window's secret the replicas key users' buckets with) is read by
  ``loragate_replica`` only: the roles' SELECT on ``canary_windows`` becomes one on every
  other column.

SQLite has no users: its owner writes it, and the application keeps the same rules. The
downgrade restores 0013's trigger, the grants as they were, and drops the function, the
column and (when no other database uses it) the role.

Revision ID: 0015
Revises: 0014
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

ROLES = ("training", "signing", "activation", "admin", "fleet")
PINNED = "SET search_path = pg_catalog, pg_temp"
EVALUATOR = "loragate_evaluator"
# every column of canary_windows but bucket_key, at this revision
WINDOW_COLUMNS = (
    "id, adapter_name, version_id, status, opened_at, thresholds, closed_at, reason, approval_flow_run_id, share"
)
RECORD_ARGS = "integer, jsonb, text"
JSON_OR_JSONB = sa.JSON().with_variant(JSONB(), "postgresql")

RECORD_OBSERVATION = f"""
CREATE FUNCTION public.loragate_record_observation(p_window_id integer, p_observation jsonb, p_reason text)
RETURNS TABLE (observation_id bigint, moved_to text)
LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE
  current_status text;
  v_verdict text := p_observation ->> 'verdict';
  stored_id bigint;
  target text;
BEGIN
  SELECT w.status INTO current_status FROM public.canary_windows w WHERE w.id = p_window_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no canary window %', p_window_id USING ERRCODE = '42501';
  END IF;
  IF current_status IS DISTINCT FROM 'open' THEN
    RAISE EXCEPTION 'canary window % is %: only an open window is observed', p_window_id, current_status
      USING ERRCODE = '42501';
  END IF;
  IF v_verdict IS NULL OR v_verdict NOT IN ('continue', 'rollback', 'ready', 'undecided') THEN
    RAISE EXCEPTION 'an observation''s verdict is continue, rollback, ready or undecided, not %', v_verdict
      USING ERRCODE = '22023';
  END IF;
  INSERT INTO public.canary_observations (window_id, at, verdict, observation)
  VALUES (p_window_id, (p_observation ->> 'at')::timestamptz, v_verdict,
          pg_catalog.jsonb_set(p_observation, '{{window_id}}', pg_catalog.to_jsonb(p_window_id)))
  RETURNING id INTO stored_id;
  target := CASE v_verdict WHEN 'ready' THEN 'ready' WHEN 'undecided' THEN 'undecided' END;
  IF target IS NOT NULL THEN
    UPDATE public.canary_windows w
    SET status = target, reason = p_reason, closed_at = CASE WHEN target = 'ready' THEN NULL ELSE now() END
    WHERE w.id = p_window_id;
  END IF;
  RETURN QUERY SELECT stored_id, target;
END $$
"""

# what the trigger function of 0012/0013 gains: a role's move to a verdict's status is
# refused (the function above runs as the evaluator, which is no loragate role's user and
# so is not limited), and a role's window takes the thresholds init wrote
VERDICT_MOVES = """  IF NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ('ready', 'undecided') THEN
    RAISE EXCEPTION 'canary window % becomes % only with the evaluator''s observation '
      '(loragate_record_observation)', OLD.id, NEW.status USING ERRCODE = '42501';
  END IF;
"""
FIXED_THRESHOLDS = """    NEW.thresholds := coalesce(
      (SELECT l.canary_thresholds FROM public.registry_limits l WHERE l.id = 1), NEW.thresholds);
"""
# the places in 0013's function where those go
BEFORE_SHARE = "  IF NEW.share IS DISTINCT FROM OLD.share THEN\n"
END_OF_INSERT = "    RETURN NEW;\n  END IF;\n  IF NEW.status IS DISTINCT FROM OLD.status AND"


def _revision(filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"loragate_migration_{filename[:4]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rules_of_0013() -> str:
    before = _revision("0013_undecided_windows.py")
    return before._window_rules(before.MOVES)


def window_rules() -> str:
    """0013's trigger function with this revision's two rules."""
    rules = _rules_of_0013()
    if rules.count(BEFORE_SHARE) != 1 or rules.count(END_OF_INSERT) != 1:
        raise RuntimeError("0013's canary window rules are not the ones this migration knows")
    rules = rules.replace(BEFORE_SHARE, VERDICT_MOVES + BEFORE_SHARE)
    return rules.replace(END_OF_INSERT, FIXED_THRESHOLDS + END_OF_INSERT)


GAIN_EVALUATOR = f"""
DO $$ BEGIN
  IF NOT pg_catalog.pg_has_role(current_user, '{EVALUATOR}', 'MEMBER') THEN
    BEGIN
      EXECUTE 'GRANT {EVALUATOR} TO ' || pg_catalog.quote_ident(current_user);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE EXCEPTION 'run GRANT {EVALUATOR} TO % as a superuser or a role with ADMIN on {EVALUATOR}, then migrate '
        'again: the migrating user hands the verdict''s function to that role', pg_catalog.quote_ident(current_user)
        USING ERRCODE = '42501';
    END;
  END IF;
END $$
"""


def _create_evaluator() -> None:
    op.execute(
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{EVALUATOR}') "
        f"THEN CREATE ROLE {EVALUATOR} NOLOGIN; END IF; END $$"
    )
    # handing a function to a role takes membership in it; a migrating user that cannot take
    # it (the role made by someone else, no ADMIN on it) stops, saying what to run, as 0010 does
    op.execute(GAIN_EVALUATOR)
    op.execute(f"GRANT USAGE ON SCHEMA public TO {EVALUATOR}")
    op.execute(f"GRANT SELECT ({WINDOW_COLUMNS}) ON canary_windows TO {EVALUATOR}")
    op.execute(f"GRANT UPDATE (status, reason, closed_at) ON canary_windows TO {EVALUATOR}")
    op.execute(f"GRANT SELECT ON registry_limits TO {EVALUATOR}")  # the window rules trigger reads the cap
    op.execute(f"GRANT SELECT, INSERT ON canary_observations TO {EVALUATOR}")  # RETURNING reads the id
    op.execute(f"GRANT USAGE ON SEQUENCE canary_observations_id_seq TO {EVALUATOR}")


def upgrade() -> None:
    op.add_column("registry_limits", sa.Column("canary_thresholds", JSON_OR_JSONB, nullable=True))
    if op.get_bind().dialect.name != "postgresql":
        return
    _create_evaluator()
    op.execute(RECORD_OBSERVATION)
    # a new owner needs CREATE on the schema at the moment it takes the function, not after
    op.execute(f"GRANT CREATE ON SCHEMA public TO {EVALUATOR}")
    op.execute(f"ALTER FUNCTION public.loragate_record_observation({RECORD_ARGS}) OWNER TO {EVALUATOR}")
    op.execute(f"REVOKE CREATE ON SCHEMA public FROM {EVALUATOR}")
    op.execute(f"REVOKE ALL ON FUNCTION public.loragate_record_observation({RECORD_ARGS}) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION public.loragate_record_observation({RECORD_ARGS}) TO loragate_activation")
    op.execute(
        "DO $$ BEGIN EXECUTE 'GRANT EXECUTE ON FUNCTION public.loragate_record_observation("
        f"{RECORD_ARGS}) TO ' || pg_catalog.quote_ident(current_user); END $$"
    )
    op.execute(window_rules())
    for role in ("signing", "activation"):
        op.execute(f"REVOKE INSERT ON canary_observations FROM loragate_{role}")
    op.execute("REVOKE UPDATE (approval_flow_run_id) ON canary_windows FROM loragate_signing")
    for role in ROLES:
        op.execute(f"REVOKE SELECT ON canary_windows FROM loragate_{role}")
        op.execute(f"GRANT SELECT ({WINDOW_COLUMNS}) ON canary_windows TO loragate_{role}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for role in ROLES:
            op.execute(f"REVOKE SELECT ({WINDOW_COLUMNS}) ON canary_windows FROM loragate_{role}")
            op.execute(f"GRANT SELECT ON canary_windows TO loragate_{role}")
        op.execute("GRANT UPDATE (approval_flow_run_id) ON canary_windows TO loragate_signing")
        for role in ("signing", "activation"):
            op.execute(f"GRANT INSERT ON canary_observations TO loragate_{role}")
        op.execute(_rules_of_0013())
        op.execute(f"DROP FUNCTION public.loragate_record_observation({RECORD_ARGS})")
        op.execute(f"REVOKE ALL ON canary_windows, canary_observations, registry_limits FROM {EVALUATOR}")
        op.execute(f"REVOKE ALL ON SEQUENCE canary_observations_id_seq FROM {EVALUATOR}")
        op.execute(f"REVOKE ALL ON SCHEMA public FROM {EVALUATOR}")
        # the role is the cluster's: dropped only when no other database still uses it
        op.execute(
            f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{EVALUATOR}') AND NOT EXISTS ("
            f"SELECT FROM pg_catalog.pg_shdepend d JOIN pg_catalog.pg_roles r ON d.refobjid = r.oid "
            f"WHERE r.rolname = '{EVALUATOR}') THEN DROP ROLE {EVALUATOR}; END IF; END $$"
        )
    op.drop_column("registry_limits", "canary_thresholds")
