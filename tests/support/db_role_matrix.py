"""The statements of the database-role matrix (``tests/test_db_roles.py``): one per write
a loragate role makes or must never make, with the roles its grants allow it to.

Each names its values through ``:params`` that the test's populated registry fills in
(``Populated.params``), so an allowed statement touches a real row.
"""

from __future__ import annotations

ROLES = ("training", "signing", "activation", "admin", "fleet")
EVERYONE = frozenset(ROLES)
NOBODY: frozenset[str] = frozenset()
LIFECYCLE = frozenset({"signing", "activation"})
ZEROS = "0" * 64

VERSION_COLUMNS = (
    "adapter_id, identity_sha256, manifest_sha256, weights_sha256, weights_size, "
    "adapter_config_sha256, base_model_id, base_model_commit, lora_rank"
)
BASE_COLUMNS = (
    "source_kind, source, content_digest, config_sha256, config_raw_sha256, rope_scaling, tokenizer_revision, "
    "transformers_version, architecture, module_shapes"
)

# (case, statement with :params from Populated.params, the roles it is allowed to)
MATRIX = [
    # everyone reads everything and appends to the audit log
    ("read-versions", "SELECT * FROM adapter_versions", EVERYONE),
    ("read-the-audit-log", "SELECT * FROM audit_events", EVERYONE),
    (
        "append-to-the-audit-log",
        "INSERT INTO audit_events (at, actor, action, details) VALUES (now(), 'probe', 'probe', '{}')",
        EVERYONE,
    ),
    # history: nobody by grant (and the owner by trigger)
    ("rewrite-the-audit-log", "UPDATE audit_events SET actor = 'mallory'", NOBODY),
    ("erase-the-audit-log", "DELETE FROM audit_events", NOBODY),
    ("truncate-the-audit-log", "TRUNCATE audit_events", NOBODY),
    ("rewrite-a-manifest", "UPDATE adapter_versions SET manifest = '{}' WHERE version_id = :v", NOBODY),
    (
        "rewrite-a-weights-digest",
        f"UPDATE adapter_versions SET weights_sha256 = '{ZEROS}' WHERE version_id = :v",
        NOBODY,
    ),
    ("cut-the-lineage", "UPDATE adapter_versions SET previous_version = NULL WHERE version_id = :v", NOBODY),
    ("delete-a-version", "DELETE FROM adapter_versions WHERE version_id = :v", NOBODY),
    ("truncate-versions", "TRUNCATE adapter_versions CASCADE", NOBODY),
    ("rename-an-adapter", "UPDATE adapters SET name = 'mallory/tiny-llama/support'", NOBODY),
    ("rewrite-a-validation-run", "UPDATE validation_runs SET status = 'failed'", NOBODY),
    ("swap-a-golden-set", f"UPDATE golden_sets SET digest = 'sha256:{ZEROS}'", NOBODY),
    ("repin-a-base", f"UPDATE base_models SET config_sha256 = '{ZEROS}'", NOBODY),
    ("forge-a-signature", "UPDATE version_signatures SET signature = 'forged'", NOBODY),
    ("erase-a-signature", "DELETE FROM version_signatures", NOBODY),
    ("rewrite-a-token-secret", f"UPDATE api_tokens SET secret_sha256 = '{ZEROS}'", NOBODY),
    ("delete-a-token", "DELETE FROM api_tokens", NOBODY),
    ("delete-a-signing-key", "DELETE FROM signing_keys WHERE key_id = :spare_key", NOBODY),
    ("move-the-schema-version", "UPDATE alembic_version SET version_num = '0005'", NOBODY),
    ("drop-a-table", "DROP TABLE replicas", NOBODY),
    # training: versions, adapters, golden sets; the revision bump is its row lock
    (
        "create-an-adapter",
        "INSERT INTO adapters (name, namespace, base, task, revision, created_at) "
        "VALUES ('acme/tiny-llama/probe', 'acme', 'tiny-llama', 'probe', 0, now())",
        frozenset({"training"}),
    ),
    (
        "register-a-version",
        "INSERT INTO adapter_versions (version_id, content_address, "
        f"{VERSION_COLUMNS}, stage, validation_status, previous_version, manifest, created_at, created_by) "
        f"SELECT 'probe', 'sha256:{ZEROS}', {VERSION_COLUMNS}, 'staging', 'pending', version_id, manifest, now(), "
        "'probe' FROM adapter_versions WHERE version_id = :v",
        frozenset({"training"}),
    ),
    (
        "attach-a-golden-set",
        "INSERT INTO golden_sets (adapter_id, digest, case_count, attached_at, attached_by) "
        f"VALUES (:adapter_id, 'sha256:{ZEROS}', 5, now(), 'probe')",
        frozenset({"training"}),
    ),
    # (fleet too: reconcile holds the adapter's row while it acts on its replicas)
    (
        "lock-an-adapter",
        "SELECT id FROM adapters WHERE id = :adapter_id FOR UPDATE",
        frozenset({"training", "signing", "activation", "fleet"}),
    ),
    (
        "bump-an-adapter-revision",
        "UPDATE adapters SET revision = revision + 1 WHERE id = :adapter_id",
        frozenset({"training", "signing", "activation", "fleet"}),
    ),
    # signing and activation: stages, pointers, canary windows
    # grants are per column: triggers keep production to activation and the canary to signing
    (
        "move-a-version-to-production",
        "UPDATE adapter_versions SET stage = 'production' WHERE version_id = :v",
        frozenset({"activation"}),
    ),
    (
        "move-the-canary-pointer",
        "UPDATE stage_pointers SET version_id = :v, moved_at = now() WHERE adapter_id = :adapter_id",
        frozenset({"signing"}),
    ),
    # production moves only on a person's sign-off applied in the same transaction, and
    # previous names only what production served (migration 0009; test_production_needs_...)
    (
        "create-the-production-pointer-without-a-sign-off",
        "INSERT INTO stage_pointers (adapter_id, stage, version_id, moved_at) "
        "VALUES (:adapter_id, 'production', :v, now())",
        NOBODY,
    ),
    (
        "point-previous-at-a-version-production-never-served",
        "INSERT INTO stage_pointers (adapter_id, stage, version_id, moved_at) "
        "VALUES (:adapter_id, 'previous', :v, now())",
        NOBODY,
    ),
    ("remove-a-pointer", "DELETE FROM stage_pointers WHERE adapter_id = :adapter_id", LIFECYCLE),
    (
        # a window is opened only as open, for a validated, signed canary, within the cap
        # (0012's trigger refuses signing and activation; the grant everyone else). Opening
        # one is signing's real path: tests/test_db_roles.py, tests/test_canary_rules_in_sql.py
        "insert-a-canary-window-already-closed",
        "INSERT INTO canary_windows (adapter_name, version_id, status, opened_at, thresholds, closed_at) "
        "VALUES (:name, :v, 'superseded', now(), '{}', now())",
        NOBODY,
    ),
    (
        "close-a-canary-window",
        "UPDATE canary_windows SET status = 'superseded', closed_at = now(), reason = 'probe' WHERE id = :window_id",
        LIFECYCLE,
    ),
    (
        # who waits for the sign-off: the promotion, on the release pool (0015)
        "await-a-sign-off",
        "UPDATE canary_windows SET approval_flow_run_id = 'probe' WHERE id = :window_id",
        frozenset({"activation"}),
    ),
    # a verdict's moves are the evaluator's function's alone (0015): no role moves a window
    # to ready or undecided, or writes an observation, but through it
    ("mark-a-window-ready", "UPDATE canary_windows SET status = 'ready' WHERE id = :window_id", NOBODY),
    (
        "end-a-window-undecided",
        "UPDATE canary_windows SET status = 'undecided', closed_at = now() WHERE id = :window_id",
        NOBODY,
    ),
    ("loosen-a-windows-thresholds", "UPDATE canary_windows SET thresholds = '{}' WHERE id = :window_id", NOBODY),
    ("read-a-window", "SELECT id, status, thresholds, share, approval_flow_run_id FROM canary_windows", EVERYONE),
    # each window's bucket secret is the replicas' (0015): SELECT * names it too
    ("read-a-windows-bucket-key", "SELECT bucket_key FROM canary_windows", NOBODY),
    ("read-every-column-of-a-window", "SELECT * FROM canary_windows", NOBODY),
    # the live-traffic share of a running window (migration 0011), up to the cap (0012): every
    # user only by activation applying a person's sign-off, and the fixture's code is unused
    ("change-a-canary-share", "UPDATE canary_windows SET share = 0.5 WHERE id = :window_id", LIFECYCLE),
    ("give-a-canary-every-user", "UPDATE canary_windows SET share = 1.0 WHERE id = :window_id", NOBODY),
    ("reopen-a-window-for-another-version", "UPDATE canary_windows SET version_id = :v", NOBODY),
    (
        "observe-a-canary",
        "INSERT INTO canary_observations (window_id, at, verdict, observation) "
        "VALUES (:window_id, now(), 'continue', '{}')",
        NOBODY,
    ),
    (
        "observe-a-canary-through-the-evaluators-function",
        "SELECT * FROM public.loragate_record_observation(:window_id, "
        'CAST(\'{"verdict": "continue", "at": "2026-01-01T00:00:00+00:00"}\' AS jsonb), \'probe\')',
        frozenset({"activation"}),
    ),
    ("rewrite-an-observation", "UPDATE canary_observations SET verdict = 'ready'", NOBODY),
    ("erase-an-observation", "DELETE FROM canary_observations", NOBODY),
    # approval codes: nobody writes one directly -- activation issues and uses them only through
    # migration 0009's functions, which check the token's and the code's secrets
    (
        "issue-an-approval-code",
        "INSERT INTO approval_codes (code_id, secret_sha256, window_id, version_id, adapter_name, token_id, "
        f"reviewer, decision, issued_at, expires_at) VALUES ('c0ffee000001', '{ZEROS}', :window_id, :v, :name, "
        ":token_id, 'reviewer', 'approve', now(), now() + interval '5 minutes')",
        NOBODY,
    ),
    ("use-an-approval-code", "UPDATE approval_codes SET used_at = now(), used_by = 'probe'", NOBODY),
    ("apply-an-approval-code", "UPDATE approval_codes SET applied_at = now(), applied_txid = txid_current()", NOBODY),
    (
        "issue-an-approval-code-to-a-forged-token",
        "SELECT loragate_issue_approval_code('c0ffee000003', '" + ZEROS + "', NULL, :v, :name, 'rollback', 300, "
        ":token_id, 'forged-secret')",
        NOBODY,
    ),
    (
        "issue-an-approval-code-already-used",
        "INSERT INTO approval_codes (code_id, secret_sha256, window_id, version_id, adapter_name, token_id, "
        f"reviewer, decision, issued_at, expires_at, used_at) VALUES ('c0ffee000002', '{ZEROS}', :window_id, :v, "
        ":name, :token_id, 'reviewer', 'approve', now(), now() + interval '5 minutes', now())",
        NOBODY,
    ),
    ("rewrite-an-approval-code", f"UPDATE approval_codes SET secret_sha256 = '{ZEROS}'", NOBODY),
    ("rebind-an-approval-code", "UPDATE approval_codes SET reviewer = 'mallory', decision = 'approve'", NOBODY),
    ("extend-an-approval-code", "UPDATE approval_codes SET expires_at = now() + interval '1 year'", NOBODY),
    ("delete-an-approval-code", "DELETE FROM approval_codes", NOBODY),
    # signing alone: validation results and signatures
    (
        "set-a-validation-status",
        "UPDATE adapter_versions SET validation_status = 'passed' WHERE version_id = :v",
        frozenset({"signing"}),
    ),
    (
        "record-a-validation-run",
        "INSERT INTO validation_runs (version_id, status, report, started_at, finished_at, actor) "
        "VALUES (:v, 'passed', '{}', now(), now(), 'probe')",
        frozenset({"signing"}),
    ),
    (
        "record-a-signature",
        "INSERT INTO version_signatures (version_id, key_id, validation_run_id, report_sha256, signature, "
        f"signed_at, signed_by) VALUES (:v, :spare_key, :run_id, '{ZEROS}', 'probe', now(), 'probe')",
        frozenset({"signing"}),
    ),
    # admin: tokens, keys, bases, the fleet; the fleet role: the fleet alone, never a token
    (
        "issue-a-token",
        "INSERT INTO api_tokens (token_id, secret_sha256, role, holder, created_at, created_by) "
        f"VALUES ('0123456789ab', '{ZEROS}', 'activation', 'probe', now(), 'probe')",
        frozenset({"admin"}),
    ),
    (
        "revoke-a-token",
        "UPDATE api_tokens SET revoked_at = now(), revoked_by = 'probe' WHERE token_id = :token_id",
        frozenset({"admin"}),
    ),
    (
        "add-a-signing-key",
        "INSERT INTO signing_keys (key_id, role, public_pem, holder, created_at, created_by) "
        "VALUES ('probe-key', 'activation', 'probe', 'probe', now(), 'probe')",
        frozenset({"admin"}),
    ),
    (
        "revoke-a-signing-key",
        "UPDATE signing_keys SET revoked_at = now(), revoked_by = 'probe' WHERE key_id = :spare_key",
        frozenset({"admin"}),
    ),
    (
        "pin-a-base",
        f"INSERT INTO base_models (base_model_id, base_model_commit, {BASE_COLUMNS}, created_at, created_by) "
        f"SELECT 'probe-base', base_model_commit, {BASE_COLUMNS}, now(), 'probe' FROM base_models "
        "WHERE base_model_id = 'tiny-llama'",
        frozenset({"admin"}),
    ),
    (
        "add-a-replica",
        "INSERT INTO replicas (url, base_model_id, base_model_commit, role, adapter_dir, max_lora_rank, max_loras, "
        "served_model_name, created_at, created_by) VALUES ('http://127.0.0.1:10', 'tiny-llama', :base_commit, "
        "'production', '/srv/adapters', 16, 4, 'tiny-llama', now(), 'probe')",
        frozenset({"admin"}),  # a person's: every evaluation believes a replica's figures (0016)
    ),
    ("remove-a-replica", "DELETE FROM replicas", frozenset({"admin"})),
    # pinned adapters (migration 0014): the fleet's traffic watch replaces the hot pins; a
    # person's pin (operator) only admin writes -- grants per column, a trigger per row
    (
        "pin-an-adapter-hot",
        "INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:free_name, 'hot', 'probe')",
        frozenset({"admin", "fleet"}),
    ),
    (
        "pin-an-adapter-as-a-persons",
        "INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:free_name, 'operator', 'probe')",
        frozenset({"admin"}),
    ),
    ("drop-a-hot-pin", "DELETE FROM adapter_pins WHERE source = 'hot'", frozenset({"admin", "fleet"})),
    ("drop-a-persons-pin", "DELETE FROM adapter_pins WHERE source = 'operator'", frozenset({"admin"})),
    (
        "make-a-hot-pin-a-persons",
        "UPDATE adapter_pins SET source = 'operator', pinned_by = 'probe', pinned_at = now() WHERE source = 'hot'",
        frozenset({"admin"}),
    ),
    ("move-a-pin-to-another-adapter", "UPDATE adapter_pins SET adapter_name = :free_name", NOBODY),
]
