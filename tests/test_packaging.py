"""What installing loragate puts into a user's environment: the ``loragate`` package alone.

The wheel is built from this checkout and installed, without its dependencies, into an empty
virtual environment; what lands in site-packages is then listed. Generic top-level names
(``registry``, ``tasks``, ``flows``, ``cli``, ``infra``) would shadow or be shadowed by other
packages of those names; the test and demo kit, the benchmarks and the tests are not product
and stay in the repository. The migrations are package data the store cannot start without.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the build reads: setuptools leaves build/ and an egg-info
    # in the tree it builds
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    # every folder of Python beside the package too: a find pattern that took one in would show
    for folder in ("loragate", "kit", "infra", "bench", "tests"):
        skip = shutil.ignore_patterns("__pycache__", "artifacts", "out", "*.egg-info", "build")
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    # no build isolation: setuptools of the test environment builds it, nothing is downloaded
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("loragate-*.whl")
    return built


@pytest.fixture(scope="module")
def site_packages(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("empty-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--python", str(python), "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = (venv / "lib").glob("python3.*/site-packages")
    return found


def test_the_wheel_holds_the_loragate_package_alone(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"loragate"}


def test_installing_writes_only_loragate_into_site_packages(site_packages):
    written = {p.name for p in site_packages.iterdir() if not p.name.endswith(".dist-info")}
    # the empty venv's own files (none without pip) aside, only the package and its metadata
    assert written - {"_virtualenv.py", "_virtualenv.pth", "__pycache__"} == {"loragate"}


def test_the_kit_benchmarks_and_tests_stay_out_of_the_installed_package(site_packages):
    installed = {p.relative_to(site_packages).as_posix() for p in (site_packages / "loragate").rglob("*.py")}
    assert not {p for p in installed if any(part in {"kit", "bench", "tests"} for part in p.split("/"))}
    assert not {p for p in installed if Path(p).stem in {"modelkit", "corpus", "tamper", "demo"}}


def test_the_installed_package_carries_its_migrations_and_its_command(site_packages):
    versions = site_packages / "loragate" / "registry" / "db" / "migrations" / "versions"
    assert sorted(p.name for p in versions.glob("0001_*.py"))
    assert (site_packages / "loragate" / "registry" / "db" / "migrations" / "script.py.mako").is_file()
    entry_points = next(site_packages.glob("loragate-*.dist-info")) / "entry_points.txt"
    assert "loragate = loragate.cli.main:main" in entry_points.read_text()
