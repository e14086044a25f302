"""The docs say what the code does: the reference pages are checked against the code.

- the CLI reference (``docs/reference/cli.md``) has one row per ``loragate`` command the
  argparse parser defines, with every option it takes, and no command or option it does not;
  a ``loragate ...`` command named anywhere in the docs or the README exists;
- the settings reference (``docs/reference/settings.md``) lists the environment variable of
  every field of ``loragate.registry.settings.Settings`` and no other; every ``LORAGATE_*`` variable
  the docs name is a setting or one of the page's "Read elsewhere" variables, and each of
  those is read by some code in the repository;
- the code layout (``docs/reference/layout.md``) has a row for every module of ``loragate/`` and
  of the resolver plugin and for no other, each role how its module's docstring begins; a
  module path or a ``loragate.<layer>...`` name the docs give exists;
- the README is one page (under 250 lines) and no page holds a block of it copied (the docs'
  index includes its opening); no page links to a file that does not exist or lies outside the
  repository, every link to a heading -- from a page, a docstring or a comment -- finds it, and
  nothing points at the design notes kept outside the repository;
- every page is in the site's nav (``mkdocs build --strict`` in ``make docs`` checks the
  links and anchors of the site as it renders them).
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import pytest
import yaml

from loragate.cli.main import build_parser
from loragate.cli.output import common_options
from loragate.registry.settings import Settings, env_var
from tests.support.docs import (
    LAYOUT_PAGE,
    copied_blocks,
    dead_code_anchors,
    dead_doc_anchors,
    first_sentence,
    layout_rows,
    modules,
    role_mismatch,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CLI_PAGE = DOCS / "reference" / "cli.md"
JSON_PAGE = DOCS / "reference" / "json.md"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
# the Kubernetes tutorial includes this file as it is (pymdownx.snippets)
INCLUDED = [ROOT / "infra" / "k8s" / "README.md"]
README_MAX_LINES = 250
# files that live beside the repository, not in it: nothing in it may point at them
OUTSIDE_NAMES = ("DESIGN" + ".md", "DEVELOPERS" + ".md", ".." + "/shared")
SOURCE_FOLDERS = ("loragate", "kit", "infra", "bench", "tests")

VAR = re.compile(r"\b(LORAGATE_[A-Z0-9_]*[A-Z0-9]|HF_HUB_CACHE)\b")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# a command as written in code: `loragate [--json] fleet add URL ...` (not kubectl's `-n loragate`)
COMMAND_USE = re.compile(r"(?<![\w./-])(?<!-n )loragate(?: --json| --token \S+)*((?: [a-z][a-z-]*){1,2})")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def all_text_pages() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *pages(), *INCLUDED]


# -- the CLI ---------------------------------------------------------------------------


def _parser_commands() -> dict[str, set[str]]:
    """Every leaf command ("fleet add", "init") and the options it defines beyond the common ones."""
    common = {o for a in common_options(top_level=False)._actions for o in a.option_strings} | {"-h", "--help"}
    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups and prefix:
            found[prefix] = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - common
        for group in groups:
            for name, sub in group.choices.items():
                walk(sub, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


COMMANDS = _parser_commands()


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` (a markdown heading line), header skipped."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows, seen = [], False
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            rows.append(cells)
        elif seen:
            break
    return [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]


def documented_commands(text: str) -> dict[str, set[str]]:
    """The CLI page's command table: command -> the options its first cell shows."""
    documented: dict[str, set[str]] = {}
    for cells in table_rows(text, "## Commands"):
        spans = CODE_SPAN.findall(cells[0])
        assert spans and spans[0].startswith("loragate "), f"row without a `loragate ...` command: {cells[0]}"
        words = []
        for word in spans[0].split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            words.append(word)
        name = " ".join(words)
        assert name not in documented, f"two rows for `loragate {name}`"
        documented[name] = set(re.findall(r"--[a-z][a-z-]*", spans[0]))
    return documented


@pytest.fixture(scope="module")
def cli_table() -> dict[str, set[str]]:
    return documented_commands(CLI_PAGE.read_text())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_is_in_the_cli_reference_with_its_options(command, cli_table):
    assert command in cli_table, f"`loragate {command}` is missing from {CLI_PAGE.relative_to(ROOT)}"
    assert cli_table[command] == COMMANDS[command], (
        f"`loragate {command}`: the parser defines {sorted(COMMANDS[command])}, the reference shows "
        f"{sorted(cli_table[command])}"
    )


def test_the_cli_reference_documents_no_command_that_does_not_exist(cli_table):
    assert sorted(set(cli_table) - set(COMMANDS)) == []


def _is_command(words: list[str]) -> bool:
    """True when ``words`` start a real command: a leaf, or a group and (if given) one of its leaves."""
    first = words[0]
    if first in COMMANDS:
        return True
    leaves = {c.split(" ", 1)[1] for c in COMMANDS if c.startswith(first + " ")}
    if not leaves:
        return False
    return len(words) == 1 or words[1] in leaves


def _code(text: str) -> list[str]:
    return FENCE.findall(text) + CODE_SPAN.findall(FENCE.sub("", text))


@pytest.mark.parametrize("page", all_text_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_named_in_the_docs_exist(page):
    unknown = sorted(
        {
            use.strip()
            for code in _code(page.read_text())
            for use in COMMAND_USE.findall(code)
            if not _is_command(use.split())
        }
    )
    assert unknown == [], f"{page.relative_to(ROOT)} names commands the CLI does not have: {unknown}"


def test_json_reference_names_real_commands():
    unknown = [
        span
        for cells in table_rows(JSON_PAGE.read_text(), "# `--json` output")
        for span in CODE_SPAN.findall(cells[0])
        if not _is_command(span.split())
    ]
    assert unknown == []


# -- the settings ------------------------------------------------------------------------


SETTING_VARS = {env_var(field) for field in Settings.model_fields}


def _variables_in_table(heading: str, column: int = 0) -> set[str]:
    rows = table_rows(SETTINGS_PAGE.read_text(), heading)
    return {v for cells in rows for v in VAR.findall(cells[column])}


def test_the_settings_reference_lists_every_setting_and_no_other():
    documented = _variables_in_table("## The settings model")
    assert sorted(SETTING_VARS - documented) == [], "settings missing from the reference"
    assert sorted(documented - SETTING_VARS) == [], "documented as settings, but Settings has no such field"


@functools.cache
def _code_texts() -> str:
    """The source of what runs (not the tests or benchmarks)."""
    folders = ("loragate", "kit", "infra")
    files = [p for folder in folders for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml"}]
    return "\n".join(p.read_text(errors="replace") for p in files if "build" not in p.parts)


OTHER_VARS = sorted(_variables_in_table("## Read elsewhere"))


@pytest.mark.parametrize("variable", OTHER_VARS)
def test_each_variable_read_elsewhere_is_read_by_some_code(variable):
    assert variable not in SETTING_VARS, f"{variable} is a setting: list it in the settings table"
    assert f'"{variable}"' in _code_texts(), f"no code reads {variable}"


@pytest.mark.parametrize("page", all_text_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_variable_the_docs_name_is_documented(page):
    known = SETTING_VARS | set(OTHER_VARS)
    unknown = sorted(set(VAR.findall(page.read_text())) - known)
    assert unknown == [], f"{page.relative_to(ROOT)} names variables the settings reference does not: {unknown}"


# -- the README, the links and the nav ---------------------------------------------------


def test_the_readme_is_one_page():
    assert len(README.read_text().splitlines()) < README_MAX_LINES


def _link_targets(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", [README, ROOT / "CHANGELOG.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_exist(page):
    """A relative link resolves to a file of the repository (of docs/ for a docs page: the site
    has nothing else); no absolute paths."""
    within = DOCS if DOCS in page.parents else ROOT
    bad = []
    for target in _link_targets(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if target.startswith("/") or within.resolve() not in path.parents or not path.exists():
            bad.append(target)
    assert bad == [], f"{page.relative_to(ROOT)} links outside the repository or to nothing: {bad}"


def _repository_texts() -> list[Path]:
    folders = [ROOT / f for f in (*SOURCE_FOLDERS, "docs")]
    files = [p for f in folders for p in f.rglob("*") if p.suffix in {".py", ".md", ".yaml", ".json", ".txt"}]
    top = [ROOT / n for n in ("README.md", "CHANGELOG.md", "Makefile", "mkdocs.yml", "prefect.yaml", "pyproject.toml")]
    return [p for p in files + top if p.is_file() and "build" not in p.relative_to(ROOT).parts]


def test_nothing_points_at_files_outside_the_repository():
    found = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _repository_texts()
        for name in OUTSIDE_NAMES
        if name in p.read_text(errors="replace")
    ]
    assert found == []


def _nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    if isinstance(nav, dict):
        return [f for value in nav.values() for f in _nav_files(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_files(config["nav"])
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in pages())


# -- headings, the code layout, the README's opening -------------------------------------------


@pytest.mark.parametrize("page", [README, ROOT / "CHANGELOG.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_heading_finds_it(page):
    """A link to a heading, of another page or of its own, names an id MkDocs gives a heading there."""
    assert dead_doc_anchors(page) == [], f"{page.relative_to(ROOT)} links to headings that do not exist"


def _sources() -> list[Path]:
    files = [p for f in SOURCE_FOLDERS for p in (ROOT / f).rglob("*") if p.suffix in {".py", ".yaml"}]
    return [p for p in files if p.is_file() and "build" not in p.relative_to(ROOT).parts]


def test_every_heading_a_docstring_or_comment_names_exists():
    """What the code points at in the docs is a heading there: a page's heading by its id, or a
    README's section by its title."""
    dead = {str(p.relative_to(ROOT)): found for p in _sources() if (found := dead_code_anchors(p))}
    assert dead == {}


@functools.cache
def _layout() -> dict[str, str]:
    return layout_rows(LAYOUT_PAGE.read_text())


def test_the_layout_lists_every_module_and_no_other():
    listed, present = set(_layout()), set(modules())
    missing = [f"{m}  ->  | `{Path(m).name}` | {first_sentence(m)} |" for m in sorted(present - listed)]
    assert missing == [], "modules with no row in docs/reference/layout.md, under their folder:\n" + "\n".join(missing)
    assert sorted(listed - present) == [], "docs/reference/layout.md lists modules that do not exist"


def test_each_role_in_the_layout_is_how_its_module_docstring_begins():
    present = set(modules())
    wrong = {m: why for m, role in _layout().items() if m in present and (why := role_mismatch(m, role))}
    assert wrong == {}, "docs/reference/layout.md: roles that are not how their module's docstring begins"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_holds_a_copy_of_the_readme(page):
    """Five lines in a row as the README has them: a copy, bound to drift from it. A page
    includes the README's part (``--8<-- "README.md:section"``) or says it in its own words."""
    copied = copied_blocks(README.read_text(), page.read_text())
    assert copied == [], f"{page.relative_to(ROOT)} copies the README:\n{copied[0]}"


NAMED_PATH = re.compile(r"(?<![\w/.$-])((?:loragate|kit|bench|tests|infra)/[\w./-]*)")
NAMED_MODULE = re.compile(r"(?<![\w.])(loragate\.(?:registry|tasks|flows|cli|local)(?:\.\w+)*)")


def _ignored_folders() -> list[str]:
    """Git-ignored output folders (``tests/artifacts/``): named by the docs, made by a run."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip() for line in lines if "/" in line.strip().rstrip("/")]


def _exists(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[i:]
            return not rest or (len(rest) == 1 and re.search(rf"\b{rest[0]}\b", module.read_text()) is not None)
    return False


@pytest.mark.parametrize("page", [README, *pages(), *INCLUDED], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_modules_and_paths_the_docs_name_exist(page):
    """A path under the code's folders, or a ``loragate.<layer>`` name, that the docs give exists:
    a module moved takes its mentions along."""
    text = FENCE.sub("", page.read_text())
    paths = {p.rstrip(".,:;)") for p in NAMED_PATH.findall(text)}
    gone = sorted(p for p in paths if not (ROOT / p).exists() and not any(p.startswith(f) for f in _ignored_folders()))
    gone += sorted(n for n in set(NAMED_MODULE.findall(text)) if not _exists(n))
    assert gone == [], f"{page.relative_to(ROOT)} names modules or paths that do not exist"
