"""Every relative link and #anchor in the README and the manual resolves.

A link's file must exist, relative to the page that links to it (a directory link to a
directory); an anchor must be the slug of a heading in the target page. The README is read on
GitHub and the manual is built by mkdocs (Python-Markdown's toc extension), which slug headings by
different rules, so every heading a link points to must get the same slug from both.
http(s) and mailto links are not checked.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The example plugins' READMEs link into the manual too.
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*/README.md")]
)

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown page outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def heading_text(raw: str) -> str:
    """A heading as rendered text: code spans' contents, links' text, no emphasis markers."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = _LINK.sub(lambda m: m.group(1), text)
    return re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text).strip()


def headings(text: str) -> list[str]:
    return [heading_text(m.group(2)) for line in prose_lines(text) if (m := _HEADING.match(line))]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def toc_slug(heading: str) -> str:
    """Python-Markdown's toc extension's default slugify (what mkdocs uses)."""
    value = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def links(text: str) -> list[str]:
    """The targets of the inline links and images of a page, outside code."""
    found = []
    for line in prose_lines(text):
        line = _CODE_SPAN.sub(
            "code", line
        )  # a link inside code is no link; code in a link's text is text
        found.extend(m.group(2) for m in _LINK.finditer(line))
    return found


def problems(page: Path) -> list[str]:
    """What is wrong with `page`'s relative links and anchors, one message each."""
    found = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"(https?|mailto):", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            found.append(f"{page.name}: link {target!r}: {path} does not exist")
            continue
        if not anchor:
            continue
        if where.is_dir() or where.suffix != ".md":
            found.append(f"{page.name}: link {target!r}: an anchor into a non-Markdown target")
            continue
        titles = headings(where.read_text(encoding="utf-8"))
        matches = [t for t in titles if github_slug(t) == anchor or toc_slug(t) == anchor]
        if not matches:
            found.append(f"{page.name}: link {target!r}: no heading of {where.name} has that slug")
        for title in matches:
            if github_slug(title) != toc_slug(title):
                found.append(
                    f"{page.name}: link {target!r}: GitHub slugs {title!r} as "
                    f"{github_slug(title)!r}, mkdocs as {toc_slug(title)!r}"
                )
    return found


def test_the_pages_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/api.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_headings_within_a_page_have_distinct_slugs(page: Path) -> None:
    """GitHub and mkdocs number a repeated slug differently (-1, _1): keep them unique."""
    slugs = [toc_slug(h) for h in headings(page.read_text(encoding="utf-8"))]
    assert sorted(s for s in set(slugs) if slugs.count(s) > 1) == []


def test_the_slug_rules_agree_with_markdown_where_it_is_installed() -> None:
    toc = pytest.importorskip("markdown.extensions.toc")
    for page in PAGES:
        for title in headings(page.read_text(encoding="utf-8")):
            assert toc_slug(title) == toc.slugify(title, "-"), title


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## What's new: `v2`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[fine](other.md#a-section) [fine](#here) [fine](other.md) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [bad here](#there)\n"
        "[fine](other.md#whats-new-v2)\n"
        "`[in code](missing-too.md)`\n\n"
        "```\n[in a block](missing-three.md)\n```\n"
    )
    assert problems(page) == [
        "page.md: link 'missing.md': missing.md does not exist",
        "page.md: link 'other.md#nowhere': no heading of other.md has that slug",
        "page.md: link '#there': no heading of page.md has that slug",
    ]
    assert github_slug("What's new: v2") == toc_slug("What's new: v2") == "whats-new-v2"
    assert github_slug("a - b") == "a---b" != toc_slug("a - b") == "a-b"
    (tmp_path / "other.md").write_text("# Other\n\n## Before - after\n")
    page.write_text("[differ](other.md#a---b) [differ](other.md#before---after)\n")
    assert problems(page) == [
        "page.md: link 'other.md#a---b': no heading of other.md has that slug",
        "page.md: link 'other.md#before---after': GitHub slugs 'Before - after' as "
        "'before---after', mkdocs as 'before-after'",
    ]
