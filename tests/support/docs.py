"""What the docs tests read: pages with their snippets included, headings and the anchors
MkDocs gives them, references to a heading from the docs and from the code, the code
layout's rows and the docstrings they stand for.
"""

from __future__ import annotations

import ast
import functools
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
LAYOUT_PAGE = DOCS / "reference" / "layout.md"
# the folders the layout lists module by module: the installed package and the resolver plugin
LAYOUT_PACKAGES = ("loragate", "infra/vllm_plugin/loragate_resolver")

FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"[ \t]*$', re.M)
SECTION_MARKER = re.compile(r"-+8<-+[ \t]+\[[ \t]*(start|end)[ \t]*:[ \t]*([a-z][-_0-9a-z]*)[ \t]*\]")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
# a heading named from code: a markdown file, ``#`` and the heading's id (the file relative to
# the repository, or to the file naming it)
CODE_ANCHOR = re.compile(r"(?<![\w/.-])([\w./-]*\.md)#([\w-]+)")
# the older form: the README, then a section's title in double quotes
README_SECTION = re.compile(r"\bREADME(?:\.md)?(?:'s)?,? \"([^\"\n]+)\"")


# -- pages and their headings ------------------------------------------------------------


def _section(text: str, name: str) -> str:
    """The lines between ``--8<-- [start:name]`` and ``--8<-- [end:name]``, as pymdownx.snippets
    takes them."""
    kept, inside = [], False
    for line in text.splitlines():
        marker = SECTION_MARKER.search(line)
        if marker and marker.group(2) == name:
            inside = marker.group(1) == "start"
        elif inside and not marker:
            kept.append(line)
    return "\n".join(kept)


def expanded(path: Path) -> str:
    """The page as the site renders it: each ``--8<-- "file[:section]"`` line replaced by what it
    includes (paths from the repository root, as ``mkdocs.yml`` sets ``base_path``)."""

    def include(match: re.Match[str]) -> str:
        target, _, name = match.group(1).partition(":")
        text = expanded(ROOT / target)
        return (
            _section(text, name)
            if name
            else "\n".join(line for line in text.splitlines() if not SECTION_MARKER.search(line))
        )

    return SNIPPET.sub(include, path.read_text())


def slugify(text: str) -> str:
    """Python-Markdown's default heading id (the ``toc`` extension MkDocs uses)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_text(raw: str) -> str:
    """A heading's text as rendered: links as their text, no code or emphasis marks."""
    text = LINK.sub(r"\1", raw)
    return re.sub(r"`|\*\*|__|<[^>]+>", "", text)


def headings(text: str) -> list[str]:
    return [heading_text(m.group(2)) for m in HEADING.finditer(FENCE.sub("", text))]


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading id of a page, repeated titles numbered as ``toc`` numbers them."""
    found: set[str] = set()
    for title in headings(expanded(path)):
        slug, n = slugify(title), 0
        while (candidate := slug if n == 0 else f"{slug}_{n}") in found or not candidate:
            n += 1
        found.add(candidate)
    return frozenset(found)


# -- references to a heading ---------------------------------------------------------------


def dead_doc_anchors(page: Path) -> list[str]:
    """Links of a markdown page to a heading (another page's or its own) that no heading has."""
    dead = []
    for _, target in LINK.findall(FENCE.sub("", page.read_text())):
        if "#" not in target or re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if linked.suffix != ".md" or not linked.is_file() or anchor not in anchors(linked):
            dead.append(target)
    return dead


def _nearest(name: str, start: Path) -> Path | None:
    for folder in [start, *start.parents]:
        if (folder / name).is_file():
            return folder / name
        if folder == ROOT:
            break
    return None


def dead_code_anchors(path: Path) -> list[str]:
    """In a source file: references to a heading of a markdown file that it lacks (the file from the
    repository root or beside the source), and README sections named by a title no heading of
    the nearest README has."""
    text = path.read_text(errors="replace")
    dead = []
    for file, anchor in CODE_ANCHOR.findall(text):
        candidates = [path.parent / file, ROOT / file]
        linked = next((c.resolve() for c in candidates if c.is_file()), None)
        if linked is None or anchor not in anchors(linked):
            dead.append(f"{file}#{anchor}")
    readme = _nearest("README.md", path.parent)
    for title in README_SECTION.findall(text):
        if readme is None or slugify(title) not in anchors(readme):
            dead.append(f"README section {title!r}")
    return dead


# -- the code layout -----------------------------------------------------------------------


def modules() -> list[str]:
    """Every Python file of the packages the layout lists, relative to the repository."""
    return sorted(
        str(p.relative_to(ROOT))
        for package in LAYOUT_PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if not {"build", "__pycache__"} & set(p.relative_to(ROOT).parts)
    )


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("``", "`").replace("\\|", "|")).strip()


def docstring_opening(module: str) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse((ROOT / module).read_text())) or ""
    return _plain(doc.split("\n\n", 1)[0])


def first_sentence(module: str) -> str:
    opening = docstring_opening(module)
    end = re.search(r"\.(?:\s|$)", opening)
    return opening[: end.start()] if end else opening


def layout_rows(text: str) -> dict[str, str]:
    """The layout page's rows: module path -> its role, from the tables under each
    ``### `folder/` `` heading."""
    rows: dict[str, str] = {}
    folder = None
    for line in FENCE.sub("", text).splitlines():
        heading = re.fullmatch(r"#{2,4} `([\w./-]+/)`", line.strip())
        if heading:
            folder = heading.group(1)
        elif line.startswith("#"):
            folder = None
        elif folder and (row := re.fullmatch(r"\| `([\w.]+\.py)` \| (.+) \|", line.strip())):
            rows[folder + row.group(1)] = _plain(row.group(2))
    return rows


def role_mismatch(module: str, role: str) -> str | None:
    """Why ``role`` is not how the module's docstring begins (cut where a word ends), or None."""
    opening, role = docstring_opening(module), role.rstrip(".")
    if not opening:
        return "the module has no docstring"
    if not opening.startswith(role) or opening[len(role) : len(role) + 1].isalnum() or len(role) < 12:
        return f"its docstring begins: {first_sentence(module)}"
    return None


def copied_blocks(source: str, page: str, lines: int = 5) -> list[str]:
    """Runs of ``lines`` consecutive non-blank lines of ``source`` found as they are in ``page``."""

    def windows(text: str) -> dict[tuple[str, ...], int]:
        found: dict[tuple[str, ...], int] = {}
        run: list[str] = []
        for line in [*text.splitlines(), ""]:
            if line.strip():
                run.append(line.strip())
                if len(run) >= lines:
                    found.setdefault(tuple(run[-lines:]), len(found))
            else:
                run = []
        return found

    theirs = windows(page)
    return ["\n".join(w) for w in windows(source) if w in theirs]
