"""Property-based: whatever JSON, safetensors header or golden line arrives, loragate answers
with a value or a typed refusal -- exit 0 or 2 from the CLI, never a traceback -- and a
refusal writes nothing.

Hypothesis generates near-valid inputs (a real manifest with one field replaced, a real
header with one entry broken) as well as hostile text (deep nesting, lone surrogates,
NUL, NaN and overflowing numbers, duplicate keys, bytes that are not UTF-8), and throws
them at the parsers directly and at ``loragate register`` / ``loragate golden set`` on a
populated registry, on SQLite and on Postgres.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loragate.registry.digests import canonical_json
from loragate.registry.errors import InvalidInput
from loragate.registry.intake.golden import match_case, parse_golden_set
from loragate.registry.intake.jsonio import loads_strict
from loragate.registry.intake.weights import read_lora_structure
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.registries import IN_PROCESS, registry_snapshot

NAME = "acme/tiny-llama/support"
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same examples on every CI run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- generators -----------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
hostile_fragments = st.sampled_from(
    [
        "[" * 100_000,
        '{"a":' * 5_000 + "1" + "}" * 5_000,
        '"\\ud800"',
        '"tail\\udfff"',
        '"nul\\u0000byte"',
        "NaN",
        "-Infinity",
        "1e400",
        "-1e999",
        "1" * 5000,
        '{"k": 1, "k": 2}',
        "[1, 2,]",
        "",
    ]
)


def render(value) -> str:
    return json.dumps(value, allow_nan=True)


@st.composite
def json_texts(draw) -> bytes:
    """Whole documents: generated values, hostile fragments, or raw bytes."""
    kind = draw(st.sampled_from(["value", "fragment", "bytes"]))
    if kind == "value":
        return render(draw(json_values)).encode()
    if kind == "fragment":
        return draw(hostile_fragments).encode()
    return draw(st.binary(max_size=64))


@st.composite
def mutated_objects(draw, valid: dict) -> bytes:
    """A valid object with one field replaced (or added) by something generated."""
    key = draw(st.sampled_from(sorted(valid)) | st.text(max_size=12))
    if draw(st.booleans()):
        text = render({**valid, key: draw(json_values)})
    else:
        fragment = draw(hostile_fragments)
        text = render({**valid, key: "__SLOT__"}).replace('"__SLOT__"', fragment or "null")
    return text.encode("utf-8", errors="surrogatepass")


def outcome_is_typed(fn, *args):
    try:
        return fn(*args)
    except InvalidInput:
        return None


# -- the parsers, directly ---------------------------------------------------------------


@PROPERTY
@given(raw=json_texts())
def test_strict_json_returns_a_canonicalisable_value_or_refuses(raw):
    value = outcome_is_typed(lambda r: loads_strict(r, what="doc", code=InvalidInput.default_code, field="doc"), raw)
    if value is not None:
        canonical_json(value)  # what the registry does next: it must not crash either


@st.composite
def safetensors_files(draw, template_path: Path) -> bytes:
    template = template_path.read_bytes()
    (length,) = struct.unpack("<Q", template[:8])
    header = json.loads(template[8 : 8 + length])
    data = template[8 + length :]
    choice = draw(st.sampled_from(["entry", "header", "length", "data"]))
    if choice == "entry":
        name = draw(st.sampled_from(sorted(header)))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
        header[name] = {**header[name], field: draw(json_values)}
        raw_header = render(header).encode("utf-8", errors="surrogatepass")
    elif choice == "header":
        raw_header = draw(json_texts())
    else:
        raw_header = template[8 : 8 + length]
    if choice == "length":
        length_bytes = struct.pack("<Q", draw(st.integers(min_value=0, max_value=2**64 - 1)))
    else:
        length_bytes = struct.pack("<Q", len(raw_header))
    if choice == "data":
        data = draw(st.binary(max_size=64)) + data[: draw(st.integers(min_value=0, max_value=len(data)))]
    return length_bytes + raw_header + data


@pytest.fixture(scope="module")
def weights_template(random_bundle) -> Path:
    return random_bundle / "adapter_model.safetensors"


@PROPERTY
@given(data=st.data())
def test_a_safetensors_file_is_read_or_refused(weights_template, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("st") / "adapter_model.safetensors"
    path.write_bytes(data.draw(safetensors_files(weights_template)))
    outcome_is_typed(read_lora_structure, path)


GOOD_CASE = {"id": "c0", "prompt": "p0", "equals": "x"}


@st.composite
def golden_files(draw) -> bytes:
    rows = [render({"id": f"g{i}", "prompt": f"prompt {i}", "equals": f"a{i}"}).encode() for i in range(5)]
    kind = draw(st.sampled_from(["mutated", "text", "expectation"]))
    if kind == "mutated":
        rows.append(draw(mutated_objects(GOOD_CASE)))
    elif kind == "text":
        rows.append(draw(json_texts()))
    else:
        expectation = draw(st.sampled_from(["equals", "contains", "regex", "json_schema"]))
        row = render({"id": "h", "prompt": "hostile", expectation: draw(json_values)})
        rows.append(row.encode("utf-8", errors="surrogatepass"))
    return b"\n".join(rows)


@PROPERTY
@given(raw=golden_files(), completion=st.text(max_size=200))
def test_a_golden_set_is_parsed_or_refused_and_its_cases_never_crash_matching(raw, completion):
    golden = outcome_is_typed(lambda r: parse_golden_set(r, min_cases=5), raw)
    for case in golden.cases if golden else ():
        ok, why = match_case(case, completion)
        assert isinstance(ok, bool) and isinstance(why, str)


# -- the CLI on a real registry: exit 0 or 2, and 2 writes nothing ------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def populated(request, tmp_path_factory, tiny_base, seeded_bundles):
    from loragate.registry.service import Registry
    from loragate.registry.settings import Settings

    root = tmp_path_factory.mktemp(f"hostile-{request.param}")
    url = f"sqlite:///{root / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_template")()
    cfg = Settings(home=root, database_url=url, artifacts=str(root / "artifacts"), actor="fuzz")
    with Registry.open(cfg, check_schema=False, principal=IN_PROCESS) as registry:
        registry.init()
        registry.add_base(str(tiny_base), "tiny-llama")
        registry.register_adapter(seeded_bundles[0], NAME)
        tokens = role_tokens(registry)
    return cfg, {"LORAGATE_DATABASE_URL": url, "LORAGATE_ARTIFACTS": cfg.artifacts, "LORAGATE_ACTOR": "fuzz"}, tokens


def run_cli(monkeypatch, capsys, env: dict, tokens: dict, *argv: str) -> tuple[int, list[str]]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    rc = main_with_tokens(tokens, [*argv, "--json"])
    out, err = capsys.readouterr()
    if rc == 2:
        assert json.loads(out)["error"]["code"]
    return rc, err.strip().splitlines()


def register_outcome(populated, monkeypatch, capsys, bundle: Path) -> None:
    cfg, env, tokens = populated
    before = registry_snapshot(cfg)
    rc, err = run_cli(monkeypatch, capsys, env, tokens, "register", str(bundle), "--name", NAME)
    assert rc in (0, 2)
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("error: ")
        assert registry_snapshot(cfg) == before


@PROPERTY
@given(data=st.data())
def test_register_with_a_generated_manifest_exits_0_or_2(
    populated, random_bundle, tmp_path_factory, monkeypatch, capsys, data
):
    bundle = tmp_path_factory.mktemp("bundle") / "b"
    shutil.copytree(random_bundle, bundle)
    valid = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_bytes(data.draw(mutated_objects(valid) | json_texts()))
    register_outcome(populated, monkeypatch, capsys, bundle)


@PROPERTY
@given(data=st.data())
def test_register_with_a_generated_safetensors_header_exits_0_or_2(
    populated, random_bundle, weights_template, tmp_path_factory, monkeypatch, capsys, data
):
    bundle = tmp_path_factory.mktemp("bundle") / "b"
    shutil.copytree(random_bundle, bundle)
    (bundle / "adapter_model.safetensors").write_bytes(data.draw(safetensors_files(weights_template)))
    register_outcome(populated, monkeypatch, capsys, bundle)


@PROPERTY
@given(raw=golden_files())
def test_golden_set_with_generated_lines_exits_0_or_2(populated, tmp_path_factory, monkeypatch, capsys, raw):
    cfg, env, tokens = populated
    path = tmp_path_factory.mktemp("golden") / "g.jsonl"
    path.write_bytes(raw)
    before = registry_snapshot(cfg)
    rc, err = run_cli(monkeypatch, capsys, env, tokens, "golden", "set", NAME, str(path))
    assert rc in (0, 2)
    if rc == 2:
        assert len(err) == 1 and registry_snapshot(cfg) == before
