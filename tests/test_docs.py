"""Every relative link and #anchor in the README and the manual resolves.

A link's file must exist, relative to the page that links to it (a directory link to a
directory); an anchor must be the slug of a heading in the target page. The README is read on
GitHub and the manual is built by mkdocs (Python-Markdown's toc extension), which slug headings by
different rules, so every heading a link points to must get the same slug from both.
http(s) and mailto links are not checked.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from dataclasses import dataclass
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


def links_out_of_the_site(page: Path, site: Path = ROOT / "docs") -> list[str]:
    """The relative links of a manual page whose target is not in `site` (docs/): dead in the
    built manual, which holds docs/ alone (mkdocs.yml's validation fails `mkdocs build --strict`
    on them too). A file elsewhere in the repository is named as code text instead."""
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        path = target.partition("#")[0]
        if not path or re.match(r"(https?|mailto):", target):
            continue
        if not (page.parent / path).resolve().is_relative_to(site.resolve()):
            out.append(target)
    return out


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_no_link_of_the_manual_leaves_the_site(page: Path) -> None:
    assert links_out_of_the_site(page) == []


def test_a_link_out_of_the_site_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[a](../README.md#install) [b](../benchmarks/) [c](spec.md#components) [d](#here)\n"
        "[e](https://example.com/x) [f](./sub/../other.md) [g](../docs/other.md) `[h](../x.md)`\n"
    )
    assert links_out_of_the_site(page, tmp_path / "docs") == [
        "../README.md#install",
        "../benchmarks/",
    ]


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


# ---------------------------------------------------------------------------------------------
# The shown outputs: every `$ command` in a fenced block of the README and docs/*.md, followed by
# what it prints, is run here and its output compared with the one shown.
# ---------------------------------------------------------------------------------------------

DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A shown command not run here, with why. A command shown in the docs that is neither run nor
# listed here fails the test, and so does an entry that names no shown command.
NOT_RUN = {
    ".venv/bin/lmcore quickstart": "trains for a minute on the standard library (tests/cli/test_quickstart.py runs it on a small corpus)",
    "lmcore eval runs/quickstart --text lmcore/spec.py": "needs the quickstart's trained run",
    "printf 'What is the capital of France?\\nAnd of Germany?\\n' | lmcore chat smol.safetensors --temperature 0": "needs SmolLM2 from the Hugging Face hub",
    ".venv/bin/lmcore plugins --kind norm": "needs lmcore-dyt installed (tox -e py311-dyt)",
    '.venv/bin/lmcore build "tinystories, norm=dyt"': "needs lmcore-dyt installed (tox -e py311-dyt)",
    '.venv/bin/lmcore build "tinystories, norm=dyt(alpha=0.8)"': "needs lmcore-dyt installed (tox -e py311-dyt)",
    "cd examples/lmcore-dyt": "the conformance run of lmcore-dyt, minutes (tox -e py311-dyt)",
    "../../.venv/bin/pytest --lmcore-conformance --lmcore-component dyt -v": "the conformance run of lmcore-dyt, minutes (tox -e py311-dyt)",
    """STDLIB="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')\"""": "sets a variable for the next commands",
    'lmcore data prepare "$STDLIB" --ext .py --exclude site-packages --exclude test --out data/stdlib': "tokenises the whole standard library (tens of seconds)",
    'lmcore data prepare "$STDLIB" --ext .py --exclude site-packages --out data/stdlib-all': "reads the standard library until its first file that is not UTF-8, which depends on the Python",
}

# A shown command whose `...` stands for options the page leaves out: what is run instead.
RUN_AS = {
    'lmcore sweep "vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4" --vary num_layers=40 --match params ...': 'lmcore sweep "vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4" --vary num_layers=40 --match params --data nowhere --out sweep',
}

# Shown commands that take over ~20 s on two busy cores (marked slow).
SLOW = {"lmcore run tinystories": "ten training steps of a 22.7M-parameter model"}

# Lines of measurements (seconds, rates, memory): compared with each number a wildcard.
MEASURED = re.compile(r"tokens/s|peak memory|\d s$")
# A measured number, with its unit where it is a size (508.48 MiB here, 1.08 GiB there).
_NUMBER = re.compile(r"\d[\d,.]*(?: (?:bytes|[KMGT]iB|B)\b)?")


@dataclass(frozen=True)
class Shown:
    """One `$ command` of a page's fenced block and the lines shown after it."""

    page: str
    line: int
    command: str
    output: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: $ {self.command}"


def shown_commands(page: Path) -> list[Shown]:
    """Every `$ ` line of `page`'s fenced blocks with the lines after it, up to the next `$ `
    line or the block's end."""
    found: list[Shown] = []
    fenced, current = False, None
    name = page.relative_to(ROOT).as_posix()
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            if current is not None:
                found.append(current)
            current = None
        elif fenced and line.startswith("$ "):
            if current is not None:
                found.append(current)
            current = Shown(name, number, line[2:], ())
        elif current is not None:
            current = Shown(current.page, current.line, current.command, (*current.output, line))
    return found


SHOWN = [s for page in DOC_PAGES for s in shown_commands(page)]


def matches(shown: tuple[str, ...], real: list[str]) -> bool:
    """`real` is what `shown` shows: line by line, a `...` line standing for any lines (none
    too), a line of measurements compared with its numbers left out."""
    if not shown:
        return not real
    head, *rest = shown
    if head == "...":
        return any(matches(tuple(rest), real[i:]) for i in range(len(real) + 1))
    if not real:
        return False
    same = (
        _NUMBER.sub("N", head) == _NUMBER.sub("N", real[0])
        if MEASURED.search(head)
        else head == real[0]
    )
    return same and matches(tuple(rest), real[1:])


def test_every_shown_command_is_run_or_listed_with_a_reason() -> None:
    commands = {s.command for s in SHOWN}
    assert len(SHOWN) >= 20 and {"lmcore plugins --kind pos", "lmcore describe gpt2-xl"} <= commands
    assert sorted(set(NOT_RUN) - commands) == [], "NOT_RUN names a command no page shows"
    assert sorted(set(RUN_AS) - commands) == [], "RUN_AS names a command no page shows"
    assert sorted(set(SLOW) - commands) == [], "SLOW names a command no page shows"
    assert sorted(BESIDE_FLASH - commands) == [], "BESIDE_FLASH names a command no page shows"
    elided = [str(s) for s in SHOWN if "..." in s.command and s.command not in {*NOT_RUN, *RUN_AS}]
    assert elided == []


def test_matches_reads_elisions_and_measurements() -> None:
    assert matches(("a", "...", "d"), ["a", "b", "c", "d"]) and matches(("...",), [])
    assert matches(("rate: 1,474 tokens/s",), ["rate: 12,003.5 tokens/s"])
    assert matches(("peak memory: 508.48 MiB (peak RSS)",), ["peak memory: 1.08 GiB (peak RSS)"])
    assert not matches(("a", "...", "d"), ["a", "b", "c"])
    assert not matches(("loss 9.2606",), ["loss 9.2607"])  # not a measurement: exact
    assert not matches(("a",), ["a", "b"])


def _run(command: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines a shown `lmcore ...` command prints (its stderr, then its stdout), run in this
    process; `| tail -N` keeps the last N lines."""
    from lmcore.cli.main import main

    command, _, pipe = command.partition(" | ")
    argv = shlex.split(command)
    assert argv[0] == "lmcore", command
    capsys.readouterr()
    main(argv[1:])
    captured = capsys.readouterr()
    lines = (captured.err + captured.out).splitlines()
    if pipe:
        tail = re.fullmatch(r"tail -(\d+)", pipe)
        assert tail is not None, pipe
        lines = lines[-int(tail.group(1)) :]
    return lines


# The commands docs/plugins.md shows beside an installed plugin, lmcore-flash, that fails to load.
BESIDE_FLASH = {
    "lmcore plugins --kind pos",
    'lmcore build "tinystories, attn=flash"',
    "lmcore build tinystories | tail -1",
}
BROKEN_FLASH = "raise ImportError('flash kernels need triton')\n"


@pytest.mark.parametrize(
    "shown",
    [
        pytest.param(s, marks=[pytest.mark.slow] if s.command in SLOW else [], id=str(s))
        for s in SHOWN
        if s.command not in NOT_RUN
    ],
)
def test_a_shown_output_is_the_real_one(
    shown: Shown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_dist, capsys
) -> None:
    from lmcore import Registry, use_registry

    monkeypatch.chdir(tmp_path)
    replace = {}
    if shown.command in BESIDE_FLASH:
        site = make_dist(
            "lmcore-flash",
            version="0.3",
            entry_points={"flash": "flash_kernels"},
            modules={"flash_kernels": BROKEN_FLASH},
        )
        replace[str(site)] = "<site-packages>"
    with use_registry(Registry()):
        real = _run(RUN_AS.get(shown.command, shown.command), capsys)
    for old, new in replace.items():
        real = [line.replace(old, new) for line in real]
    assert matches(shown.output, real), "\n".join(
        [f"{shown} shows:", *shown.output, "but prints:", *real]
    )
