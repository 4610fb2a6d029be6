"""The README is a front door and the reference lives in docs/: README.md stays within 160 lines, its tour
comes before line 60, its first 100 lines hold fewer than 10 statistics terms, and it links every docs page;
every relative link in README.md and docs/*.md reaches a file that exists (and, with #anchor, a heading in
it); every docs page opens with a `# ` title and links back."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MAX_README_LINES = 160
TOUR_BY_LINE = 60
# Words of the statistics behind the calls: the README's first 100 lines say what the tool does and how to run
# it; how a call is made lives in docs/statistics.md. Counted case-insensitively, each occurrence once.
STATS_TERMS = ("interval", "confidence", "alpha", "family-wise", "bonferroni", "variance", "degrees of freedom",
               "p-value", "pool", "significan", "margin", "seed-to-seed", "sd ", "power", "calibrat", "holm",
               "quantile", "simultaneous", "error rate", "standard error", "moderat", "equivalence", " t ")

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...: not a file here
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def prose(text: str) -> str:
    """The text without fenced code blocks (their lines kept blank) and without code spans."""
    lines, fence = [], None
    for line in text.splitlines():
        opener = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and opener:
            fence = opener[1]
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return CODE_SPAN.sub("", "\n".join(lines))


def links(path: Path) -> list[str]:
    """Every link target in a markdown file, in order (inline links, images, reference definitions)."""
    text = prose(path.read_text(encoding="utf-8"))
    return INLINE_LINK.findall(text) + REFERENCE_DEF.findall(text)


def local_links(path: Path) -> list[tuple[str, Path, str]]:
    """(link, the file it points to, its anchor or '') for each relative link to another file."""
    out = []
    for link in links(path):
        if SCHEME.match(link) or link.startswith("#"):
            continue
        target, _, anchor = link.partition("#")
        out.append((link, (path.parent / unquote(target)).resolve(), anchor))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation other than '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


MARKDOWN = [README, *PAGES]


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; keep it within {MAX_README_LINES} and move reference text to docs/")
    tour = next(i for i, line in enumerate(lines, 1) if line.startswith("## Tour"))
    assert tour < TOUR_BY_LINE, f"the tour starts at line {tour}: keep it before line {TOUR_BY_LINE}"
    head = " ".join(lines[:100]).lower()
    found = {term: head.count(term) for term in STATS_TERMS if term in head}
    assert sum(found.values()) < 10, f"statistics terms in the README's first 100 lines: {found}"


def test_the_front_door_check_counts_what_it_should():
    text = "the interval at 95 % confidence, Bonferroni over the family-wise alpha; pooling the variance"
    assert sum(text.lower().count(t) for t in STATS_TERMS) == 7


def test_every_docs_page_is_linked_from_the_readme():
    assert PAGES, "docs/ holds no .md page"
    linked = {target for _, target, _ in local_links(README)}
    missing = [rel(page) for page in PAGES if page.resolve() not in linked]
    assert missing == [], f"README.md does not link these docs pages: {', '.join(missing)}"


@pytest.mark.parametrize("path", MARKDOWN, ids=rel)
def test_relative_links_point_to_existing_files(path):
    broken = [f"{rel(path)}: ({link}) -> {rel(target)} does not exist"
              for link, target, _ in local_links(path) if not target.exists()]
    assert broken == [], "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", MARKDOWN, ids=rel)
def test_link_anchors_match_a_heading(path):
    broken = [f"{rel(path)}: ({link}) -> no heading in {rel(target)} has the anchor #{anchor}"
              for link, target, anchor in local_links(path)
              if anchor and target.is_file() and target.suffix == ".md" and anchor not in anchors(target)]
    assert broken == [], "links to missing anchors:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_docs_page_starts_with_a_title(page):
    first = page.read_text(encoding="utf-8").splitlines()[:1]
    assert first and first[0].startswith("# ") and first[0][2:].strip(), (
        f"{rel(page)} must start with a one-line '# Title'; its first line is {first[0] if first else '(empty)'!r}")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_docs_page_links_back_to_the_readme(page):
    targets = {target for _, target, _ in local_links(page)}
    assert README.resolve() in targets, f"{rel(page)} has no link back to the README (../README.md)"


def test_slugs_follow_github():
    """The anchor rule the link test relies on, on headings of the kinds these pages use."""
    assert slug("What the five-flips study found (this machine)") == "what-the-five-flips-study-found-this-machine"
    assert slug("Corpora: text, datasets, `hf:`") == "corpora-text-datasets-hf"
    assert slug("The demo's budget: why 300 steps") == "the-demos-budget-why-300-steps"
    assert slug("Four parts of 2024-2026 models") == "four-parts-of-2024-2026-models"
    assert slug("moe_aux_loss and [links](x.md)") == "moe_aux_loss-and-links"


def test_the_readme_says_how_long_make_demo_takes_in_minutes_from_the_benchmark():
    """A newcomer's first question: beside `make demo`, its wall time in minutes on a named machine, the
    number benchmarks/bench_demo.py --whole wrote into benchmarks/RESULTS.md (the latest such section)."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    sections = results.split("\n## bench_demo --whole: make demo's wall time")[1:]
    assert sections, "benchmarks/RESULTS.md has no bench_demo --whole section: python benchmarks/bench_demo.py --whole"
    minutes = re.search(r"start to report: \*\*([0-9.]+) min\*\*", sections[-1]).group(1)
    setup = next(line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("make demo "))
    assert f"{minutes} min" in setup, f"the README's make demo line must say {minutes} min (RESULTS.md): {setup}"
