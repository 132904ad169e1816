"""Links between the docs land: every relative link of the README, docs/ and the deploy/ and benchmarks/ READMEs
names a file that exists and, with a #fragment, a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "deploy").glob("*/README.md")),
    ROOT / "benchmarks" / "README.md",
]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    one numbered."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _FENCE.sub("", markdown), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_anchors_follow_githubs_rules() -> None:
    text = "# Kafka output\n## `cdcd status`\n### The final tree (2026-11-27, load 1.1–3.8)\n## Kafka output\n"
    expected = {"kafka-output", "cdcd-status", "the-final-tree-2026-11-27-load-1138", "kafka-output-1"}
    assert anchors(text) == expected  # the en dash is dropped, not made a hyphen


def test_every_relative_link_lands() -> None:
    broken = []
    for page in PAGES:
        text = _FENCE.sub("", page.read_text())
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
                broken.append(f"{where} (no such heading)")
    assert not broken, "links that do not land:\n" + "\n".join(broken)
