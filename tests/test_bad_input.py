"""Bad input is refused with a typed error, exit code 2, and changes nothing.

Each case mutates a copy of a real, registrable bundle (or the name, or a limit) and
runs ``loragate register`` in-process. The registry already holds a base and a version,
so "nothing changed" is checked against real content: every row of every table, the
SQLite file bytes, and every file of the artifact store.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cli.main import main
from registry.errors import ErrorCode
from tests.support.registries import IN_PROCESS, registry_snapshot

NAME = "acme/tiny-llama/support"
WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


# -- mutations of a bundle directory ----------------------------------------------


def edit_json(name: str, fn: Callable[[dict], None]):
    def mutate(d: Path) -> None:
        data = json.loads((d / name).read_text())
        fn(data)
        (d / name).write_text(json.dumps(data))

    return mutate


def manifest(fn):
    return edit_json("manifest.json", fn)


def config(fn):
    return edit_json("adapter_config.json", fn)


def both(fn_manifest, fn_config):
    def mutate(d: Path) -> None:
        manifest(fn_manifest)(d)
        config(fn_config)(d)

    return mutate


def tensors(fn: Callable[[dict], None]):
    def mutate(d: Path) -> None:
        sd = load_file(d / WEIGHTS)
        fn(sd)
        save_file(sd, d / WEIGHTS)

    return mutate


def raw_manifest_field(key: str, json_text: str):
    """Set a manifest field to raw JSON text: what json.dumps could never write."""

    def mutate(d: Path) -> None:
        data = json.loads((d / "manifest.json").read_text())
        data[key] = "__RAW__"
        (d / "manifest.json").write_text(json.dumps(data).replace('"__RAW__"', json_text))

    return mutate


def raw_header(fn: Callable[[str], str]):
    """Rewrite the safetensors header's JSON text, keeping the data section."""

    def mutate(d: Path) -> None:
        raw = (d / WEIGHTS).read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = fn(raw[8 : 8 + length].decode()).encode()
        (d / WEIGHTS).write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length :])

    return mutate


def duplicate_first_tensor(header: str) -> str:
    """Name the first tensor a second time: a parser keeping the last entry would hide the first."""
    first = next(k for k in json.loads(header) if k != "__metadata__")
    return header[:-1] + f', {json.dumps(first)}: {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}}}'


def raw_weights(fn: Callable[[bytes], bytes]):
    def mutate(d: Path) -> None:
        (d / WEIGHTS).write_bytes(fn((d / WEIGHTS).read_bytes()))

    return mutate


def set_value(key: str, value: float):
    def fn(sd):
        sd[key] = sd[key].clone()
        sd[key][0, 0] = value

    return fn


def rename_keys(old: str, new: str):
    def fn(sd):
        for k in list(sd):
            sd[k.replace(old, new)] = sd.pop(k)

    return fn


def drop_module(module: str):
    def fn(sd):
        for k in [k for k in sd if f".{module}." in k]:
            del sd[k]

    return fn


def symlink_outside(d: Path) -> None:
    outside = d.parent / f"{d.name}-outside.safetensors"
    shutil.move(d / WEIGHTS, outside)
    os.symlink(outside, d / WEIGHTS)


def weights_is_directory(d: Path) -> None:
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).mkdir()


def put(key, value):
    return lambda data: data.__setitem__(key, value)


def delete(key):
    return lambda data: data.pop(key)


# (case id, mutation, name, extra env, expected code, expected field)
CASES = [
    # safetensors structure
    (
        "corrupt-header-json",
        raw_weights(lambda b: b[:8] + b"{not json" + b[17:]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("truncated-file", raw_weights(lambda b: b[:-100]), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("shorter-than-header", raw_weights(lambda b: b[:5]), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "header-length-past-end",
        raw_weights(lambda b: struct.pack("<Q", len(b) * 2) + b[8:]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("empty-file", raw_weights(lambda b: b""), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("extra-bytes-after-data", raw_weights(lambda b: b + b"\0" * 16), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    # tensor values
    ("nan-in-lora-a", tensors(set_value(Q_A, float("nan"))), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("inf-in-lora-b", tensors(set_value(Q_B, float("inf"))), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "all-lora-b-zero",
        tensors(lambda sd: [sd.__setitem__(k, torch.zeros_like(v)) for k, v in list(sd.items()) if "lora_B" in k]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "integer-tensor",
        tensors(lambda sd: sd.__setitem__(Q_A, sd[Q_A].to(torch.int32))),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "non-lora-tensor",
        tensors(lambda sd: sd.__setitem__("base_model.model.lm_head.weight", torch.ones(4, 4))),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("lora-a-without-b", tensors(lambda sd: sd.pop(Q_B)), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "a-b-rank-disagree",
        tensors(lambda sd: sd.__setitem__(Q_B, sd[Q_B][:, :4].contiguous())),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "key-prefix-stripped",
        tensors(rename_keys("base_model.model.", "")),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    # binding to the base's layers
    ("layer-not-in-base", tensors(rename_keys("layers.1.", "layers.7.")), NAME, {}, ErrorCode.BASE_MISMATCH, WEIGHTS),
    (
        "renamed-layer-prefix",
        tensors(rename_keys("model.model.layers", "model.decoder.layers")),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        WEIGHTS,
    ),
    (
        "shape-not-base-shape",
        tensors(lambda sd: sd.__setitem__(Q_A, sd[Q_A][:, :64].contiguous())),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        WEIGHTS,
    ),
    # manifest vs adapter_config vs weights
    (
        "alpha-zero",
        both(put("lora_alpha", 0), put("lora_alpha", 0)),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "lora_alpha",
    ),
    ("rank-manifest-vs-config", manifest(put("lora_rank", 4)), NAME, {}, ErrorCode.MANIFEST_MISMATCH, "lora_rank"),
    (
        "rank-weights-vs-both",
        both(put("lora_rank", 4), put("r", 4)),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "lora_rank",
    ),
    ("alpha-manifest-vs-config", manifest(put("lora_alpha", 32)), NAME, {}, ErrorCode.MANIFEST_MISMATCH, "lora_alpha"),
    (
        "dropout-manifest-vs-config",
        manifest(put("lora_dropout", 0.1)),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "lora_dropout",
    ),
    (
        "targets-manifest-vs-config",
        manifest(put("target_modules", ["q_proj", "k_proj"])),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "target_modules",
    ),
    (
        "targets-fewer-than-weights",
        both(put("target_modules", ["q_proj"]), put("target_modules", ["q_proj"])),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "target_modules",
    ),
    (
        "target-matching-nothing",
        both(
            put("target_modules", ["q_proj", "v_proj", "k_proj"]), put("target_modules", ["q_proj", "v_proj", "k_proj"])
        ),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "target_modules",
    ),
    (
        "target-regex-matching-part",
        both(put("target_modules", r".*q_proj"), put("target_modules", r".*q_proj")),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "target_modules",
    ),
    (
        "config-names-other-base",
        config(put("base_model_name_or_path", "meta-llama/Llama-3.1-8B")),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "base_model_id",
    ),
    (
        "config-revision-other-commit",
        config(put("revision", "f" * 40)),
        NAME,
        {},
        ErrorCode.MANIFEST_MISMATCH,
        "base_model_commit",
    ),
    (
        "dora-adapter",
        config(put("use_dora", True)),
        NAME,
        {},
        ErrorCode.INVALID_ADAPTER_CONFIG,
        "adapter_config.use_dora",
    ),
    (
        "modules-to-save",
        config(put("modules_to_save", ["lm_head"])),
        NAME,
        {},
        ErrorCode.INVALID_ADAPTER_CONFIG,
        "adapter_config.modules_to_save",
    ),
    (
        "not-lora",
        config(put("peft_type", "IA3")),
        NAME,
        {},
        ErrorCode.INVALID_ADAPTER_CONFIG,
        "adapter_config.peft_type",
    ),
    (
        "adapter-config-not-json",
        lambda d: (d / "adapter_config.json").write_text("{r: 8"),
        NAME,
        {},
        ErrorCode.INVALID_ADAPTER_CONFIG,
        "adapter_config.json",
    ),
    # digests and base binding
    (
        "wrong-claimed-digest",
        manifest(put("weights_sha256", "ab" * 32)),
        NAME,
        {},
        ErrorCode.DIGEST_MISMATCH,
        "weights_sha256",
    ),
    (
        "unknown-base-commit",
        manifest(put("base_model_commit", "sha256:" + "0" * 64)),
        NAME,
        {},
        ErrorCode.UNKNOWN_BASE,
        "base_model_commit",
    ),
    (
        "unknown-base-id",
        both(put("base_model_id", "mystery-7b"), put("base_model_name_or_path", "mystery-7b")),
        "acme/mystery-7b/support",
        {},
        ErrorCode.UNKNOWN_BASE,
        "base_model_id",
    ),
    (
        "config-hash-mismatch",
        manifest(put("base_config_sha256", "cd" * 32)),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        "base_config_sha256",
    ),
    (
        "rope-scaling-mismatch",
        manifest(put("rope_scaling", {"rope_type": "linear", "factor": 2.0})),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        "rope_scaling",
    ),
    (
        "tokenizer-mismatch",
        manifest(put("tokenizer_revision", "sha256:" + "e" * 64)),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        "tokenizer_revision",
    ),
    (
        "malformed-commit",
        manifest(put("base_model_commit", "main")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "base_model_commit",
    ),
    # manifest schema
    ("missing-required-field", manifest(delete("lora_rank")), NAME, {}, ErrorCode.INVALID_MANIFEST, "lora_rank"),
    ("missing-base-model-id", manifest(delete("base_model_id")), NAME, {}, ErrorCode.INVALID_MANIFEST, "base_model_id"),
    # required provenance: never inferred, never defaulted
    (
        "missing-base-model-commit",
        manifest(delete("base_model_commit")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "base_model_commit",
    ),
    (
        "missing-training-git-commit",
        manifest(delete("training_git_commit")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "training_git_commit",
    ),
    (
        "missing-quantization-config",
        manifest(delete("quantization_config")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "quantization_config",
    ),
    (
        "training-git-commit-not-hex",
        manifest(put("training_git_commit", "main")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "training_git_commit",
    ),
    ("unknown-field-typo", manifest(put("lora_rnak", 8)), NAME, {}, ErrorCode.INVALID_MANIFEST, "lora_rnak"),
    ("rank-as-string", manifest(put("lora_rank", "8")), NAME, {}, ErrorCode.INVALID_MANIFEST, "lora_rank"),
    (
        "manifest-not-json",
        lambda d: (d / "manifest.json").write_text("lora_rank: 8"),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "manifest-duplicate-key",
        lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:-1] + ', "lora_rank": 4}'),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    # hostile JSON: refused at the parser, before anything is stored
    (
        "manifest-nested-100000-deep",
        raw_manifest_field("training_metadata", "[" * 100_000 + "]" * 100_000),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "manifest-lone-surrogate",
        raw_manifest_field("training_metadata", '{"note": "\\ud800"}'),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "manifest-nul-character",
        raw_manifest_field("adapter_checkpoint", '"final\\u0000"'),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "manifest-number-overflowing-to-infinity",
        raw_manifest_field("training_metadata", '{"loss": 1e400}'),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "manifest-nan",
        raw_manifest_field("training_metadata", '{"loss": NaN}'),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "header-nested-100000-deep",
        raw_header(lambda h: h[:-1] + ', "__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "header-duplicate-tensor-name",
        raw_header(duplicate_first_tensor),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "header-dtype-not-a-string",
        raw_header(lambda h: h.replace('"dtype":"F32"', '"dtype":[]', 1)),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "manifest-is-array",
        lambda d: (d / "manifest.json").write_text("[]"),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "manifest.json",
    ),
    (
        "lifecycle-field-claimed",
        manifest(put("validation_status", "passed")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "validation_status",
    ),
    (
        "invented-adapter-version",
        manifest(put("adapter_version", "20990101_000000_abcdefabcdef")),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "adapter_version",
    ),
    (
        "bad-quantization-dtype",
        manifest(
            put(
                "quantization_config",
                {
                    "load_in_4bit": True,
                    "bnb_4bit_compute_dtype": "float8",
                    "bnb_4bit_quant_type": "nf4",
                    "bnb_4bit_use_double_quant": False,
                },
            )
        ),
        NAME,
        {},
        ErrorCode.INVALID_MANIFEST,
        "quantization_config.bnb_4bit_compute_dtype",
    ),
    # names
    ("name-dotdot", None, "../x", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-double-slash", None, "a//b", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-traversal-segment", None, "acme/../support", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-uppercase", None, "Acme/tiny-llama/support", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-four-segments", None, "acme/tiny-llama/support/v2", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-leading-slash", None, "/acme/tiny-llama", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-base-not-manifest-base", None, "acme/tiny-llama2/support", {}, ErrorCode.MANIFEST_MISMATCH, "base_model_id"),
    # limits and files
    ("weights-over-limit", None, NAME, {"LORAGATE_MAX_WEIGHTS_BYTES": "1000"}, ErrorCode.TOO_LARGE, WEIGHTS),
    ("json-file-over-limit", None, NAME, {"LORAGATE_MAX_JSON_BYTES": "64"}, ErrorCode.TOO_LARGE, "adapter_config.json"),
    ("rank-above-fleet-max", None, NAME, {"LORAGATE_MAX_LORA_RANK": "1"}, ErrorCode.RANK_LIMIT, "lora_rank"),
    ("symlink-escaping-bundle", symlink_outside, NAME, {}, ErrorCode.INVALID_BUNDLE, WEIGHTS),
    ("weights-is-a-directory", weights_is_directory, NAME, {}, ErrorCode.INVALID_BUNDLE, WEIGHTS),
    (
        "missing-adapter-config",
        lambda d: (d / "adapter_config.json").unlink(),
        NAME,
        {},
        ErrorCode.INVALID_BUNDLE,
        "adapter_config.json",
    ),
    ("missing-bundle-dir", lambda d: shutil.rmtree(d), NAME, {}, ErrorCode.INVALID_BUNDLE, "bundle"),
]


# -- the registry under test and its snapshot ----------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def populated(request, tmp_path_factory, tiny_base, random_bundle, seeded_bundles):
    from registry.service import Registry
    from registry.settings import Settings

    root = tmp_path_factory.mktemp(f"bad-input-{request.param}")
    url = f"sqlite:///{root / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_template")()
    settings = Settings(home=root, database_url=url, artifacts=str(root / "artifacts"), actor="tester")
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    registry.register_adapter(seeded_bundles[0], NAME)
    trainer = registry.create_token("training", "trainer")[1]
    registry.close()
    env = {
        "LORAGATE_DATABASE_URL": url,
        "LORAGATE_ARTIFACTS": str(root / "artifacts"),
        "LORAGATE_ACTOR": "tester",
        "LORAGATE_TOKEN": trainer,
    }
    return settings, env


def snapshot(settings) -> dict:
    return registry_snapshot(settings)


@pytest.mark.parametrize("case_id, mutate, name, extra_env, code, field", CASES, ids=[c[0] for c in CASES])
def test_bad_register_exits_2_with_typed_error_and_changes_nothing(
    populated, random_bundle, tmp_path, monkeypatch, capsys, case_id, mutate, name, extra_env, code, field
):
    settings, env = populated
    bundle = tmp_path / "bundle"
    shutil.copytree(random_bundle, bundle)
    if mutate is not None:
        mutate(bundle)
    for k, v in {**env, **extra_env}.items():
        monkeypatch.setenv(k, v)
    before = snapshot(settings)

    rc = main(["register", str(bundle), "--name", name, "--json"])

    out, err = capsys.readouterr()
    assert rc == 2
    error = json.loads(out)["error"]
    assert error["code"] == code.value
    assert error["field"] == field
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code.value} [{field}]: ")
    assert snapshot(settings) == before


def test_the_unmutated_bundle_registers(populated, random_bundle, monkeypatch, capsys):
    """The fixture every bad case mutates is itself good: the failures above are real."""
    settings, env = populated
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(["register", str(random_bundle), "--name", "control/tiny-llama/support", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["created"] is True


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json", "manifest.json"])
def test_a_fifo_in_a_bundle_is_refused_without_blocking(populated, random_bundle, tmp_path, name):
    """Opening a FIFO for reading waits for a writer forever: the CLI must not."""
    import subprocess
    import sys

    settings, env = populated
    bundle = tmp_path / "bundle"
    shutil.copytree(random_bundle, bundle)
    (bundle / name).unlink()
    os.mkfifo(bundle / name)
    before = snapshot(settings)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "register", str(bundle), "--name", NAME, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["error"]["field"] == name
    assert "FIFO" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert snapshot(settings) == before


def test_a_fifo_as_golden_set_is_refused_without_blocking(populated, tmp_path):
    import subprocess
    import sys

    settings, env = populated
    fifo = tmp_path / "golden.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "golden", "set", NAME, str(fifo), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "invalid_golden_set"
