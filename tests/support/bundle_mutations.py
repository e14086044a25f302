"""Mutations of a copy of a real, registrable bundle: what ``tests/test_bad_input.py``'s
cases do to it before ``loragate register`` sees it.

Each helper returns a function of the bundle directory that breaks one thing in place: a
JSON file's fields (``manifest``, ``config``, ``both`` with ``put`` and ``delete``, or raw
JSON text with ``raw_manifest_field``), the weights' tensors (``tensors`` with
``set_value``, ``rename_keys``, ``drop_module``), the safetensors file's bytes or header
text (``raw_weights``, ``raw_header``), or the files themselves (a symlink out of the
bundle, a directory where the weights were).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file, save_file

# the name every case registers under: the registry under test already holds a version of it
NAME = "acme/tiny-llama/support"
WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


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
