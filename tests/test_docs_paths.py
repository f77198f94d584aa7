"""Docs true (issue 21): README.md and docs/*.md name only files that exist in the repository.

A repository path is a word starting with one of the repository's top directories (`lab/...py`,
`plans/...`, `docs/...`, `topologies/...`, `bench/...`, `tests/...`, profiles, engine). A path
with a placeholder (`NAME`, `<node>`, `*`, `{a,b}`) must match at least one file. Relative
markdown links and bare `NAME.md` names must be a doc of the repository too (the latter, or one
of the Markdown files a run directory holds).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPS = "lab|plans|docs|topologies|bench|tests|vpn_profiles|cpu_profiles|engine|\\.ci"
PATH = re.compile(rf"(?<![\w/.$-])((?:{TOPS})/[\w./*<>{{}},-]*[\w*>}}/])")
PLACEHOLDER = re.compile(r"<[^>/]*>|\{[^}/]*\}|\b[A-Z][A-Z0-9_]*\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
BARE_MD = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")
#: words that look like paths and are none (said why)
NOT_PATHS = {
    "lab/pub": "docs/fidelity.md: a column header, the lab's figure over the published one",
    "lab/calib-<pid>": "docs/cpu.md: a cgroup, not a file",
    "lab/calib-pkt-<pid>": "docs/cpu.md: a cgroup, not a file",
}
#: the Markdown files a run directory holds (docs/results.md, docs/ci.md), not docs
RUN_FILES = {"report.md", "compare.md", "check.md"}


def _lines():
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            yield f"{doc.relative_to(ROOT)}:{n}", doc, line


def _exists(path: str) -> bool:
    path = path.rstrip("/.")
    if "*" in path or PLACEHOLDER.search(path):
        pattern = PLACEHOLDER.sub("*", path)
        pattern = re.sub(r"\*+", "*", pattern)
        return any(ROOT.glob(pattern))
    return (ROOT / path).exists()


def missing_paths() -> list[str]:
    return [
        f"{where}: {m.group(1)}"
        for where, _doc, line in _lines()
        for m in PATH.finditer(line)
        if m.group(1) not in NOT_PATHS and not _exists(m.group(1))
    ]


def test_repository_paths_exist():
    assert missing_paths() == []


def test_markdown_links_and_doc_names_exist():
    docs = {d.name for d in DOCS}
    bad = []
    for where, doc, line in _lines():
        for m in LINK.finditer(line):
            target = m.group(1)
            if "://" not in target and not target.startswith("mailto:"):
                if not (doc.parent / target).exists():
                    bad.append(f"{where}: link {target}")
        for m in BARE_MD.finditer(line):
            if m.group(1) not in docs | RUN_FILES:
                bad.append(f"{where}: {m.group(1)}")
    assert bad == []


@pytest.mark.parametrize(
    "text, found",
    [
        ("see `lab/nosuch.py` and plans/gone.toml", ["lab/nosuch.py", "plans/gone.toml"]),
        ("`lab/vpn/<driver>.py`, `vpn_profiles/NAME.toml`, tests/test_*.py", []),
        ("`lab/vpn/<x>.nosuch` and docs/nosuch/*.md", ["lab/vpn/<x>.nosuch", "docs/nosuch/*.md"]),
        ("a cgroup lab/ID/N, the file docs/design.md", []),
        ("$HOME/lab/x and https://example.org/docs/x.md", []),
    ],
)
def test_the_check_itself(text, found):
    """The scanner finds a path that is not there, and passes placeholders that match."""
    paths = [m.group(1) for m in PATH.finditer(text)]
    assert [p for p in paths if not _exists(p)] == found
