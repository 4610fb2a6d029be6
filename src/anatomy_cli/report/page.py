"""A report as data, rendered to markdown and to one self-contained HTML file (no torch).

A document is a title, a lead paragraph and a list of sections; a section is a title and blocks:
  ("p", text)                     a paragraph (markdown: `code` and **bold** kept; HTML: rendered)
  ("list", [text, ...])           bullet points
  ("code", text)                  a shell command
  ("table", frame of strings, scroll)   a preformatted table; scroll=True: a scrolling box in HTML
  ("img", path)                   a PNG (markdown links it; HTML embeds it as base64)
  ("samples", [(heading, text)])  generated text, fenced / in a grid of cards
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

WRAP_COLUMNS = ("note",)  # long prose cells wrap; every other cell keeps to one line (tables scroll)
TEXT_COLUMNS = ("run_id", "label", "status", "flip", "component", "direction", "change", "against", "group",
                "margin_basis", "note", "call", "interval", "metric", "size", "flags",
                "shared interval", "shared call", "flag", "config", "why")  # the last five: lr_comparison.py's tables


def markdown(title: str, lead: str, sections: list[tuple[str, list]]) -> str:
    parts = [f"# {title}\n\n{lead}"]
    for name, blocks in sections:
        parts.append(f"## {name}\n\n" + "\n\n".join(_md_block(b) for b in blocks))
    return "\n\n".join(parts) + "\n"


def _md_block(block: tuple) -> str:
    kind = block[0]
    if kind == "p":
        return block[1]
    if kind == "list":
        return "\n".join(f"- {t}" for t in block[1])
    if kind == "code":
        return f"```bash\n{block[1]}\n```"
    if kind == "table":
        return md_table(block[1]) if len(block[1]) else "_None._"
    if kind == "img":
        return f"![{Path(block[1]).stem}]({Path(block[1]).name})"
    if kind == "samples":
        return "\n\n".join(_md_sample(h, t) for h, t in block[1]) or "_None._"
    raise ValueError(f"unknown block {kind!r}")


def md_table(table: pd.DataFrame) -> str:
    # Cells are preformatted strings: no number parsing, but numbers still align right.
    align = ["left" if c in TEXT_COLUMNS else "right" for c in table.columns]
    return table.to_markdown(index=False, disable_numparse=True, colalign=align)


def _md_sample(heading: str, text: str) -> str:
    # The corpus is markdown, so a sample may hold ``` itself: fence with one backtick more.
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"### {heading}\n\n{fence}text\n{text.rstrip()}\n{fence}"


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1300px;padding:0 1.5em;
line-height:1.45;color:#222}h1{margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
nav{font-size:14px;margin:.5em 0 1em}nav a{margin-right:1em}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px}
td{text-align:right}td.t{text-align:left}th{background:#f3f3f3;position:sticky;top:0}
.scroll{max-height:30em;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}
.scroll td{white-space:nowrap}
img{max-width:100%;height:auto}.fig{overflow-x:auto}.tw{overflow-x:auto;max-width:100%}
td{white-space:nowrap}td.w{white-space:normal;min-width:18em}
@media (max-width:760px){body{padding:0 .8em}}
@media (max-width:600px){table{font-size:12px}td,th{padding:2px 4px}.c-rank{display:none}
.tw td{white-space:normal}.tw td.c-run-id,.tw td.c-label{white-space:nowrap}}code{background:#f3f3f3;padding:0 .25em}
pre{white-space:pre-wrap;background:#f7f7f7;padding:.6em;font-size:12px}pre.cmd{background:#eef3fb}
.samples{display:grid;gap:1em;grid-template-columns:repeat(auto-fill,minmax(24em,1fr))}
figcaption{font-weight:600}.lead{font-size:15px}"""  # noqa: E501 (CSS: one rule set per line)


def html_page(title: str, lead: str, sections: list[tuple[str, list]]) -> str:
    nav = "".join(f'<a href="#{_anchor(n)}">{html.escape(n)}</a>' for n, _ in sections)
    parts = [f"<h1>{html.escape(title)}</h1><p class=\"lead\">{_inline(lead)}</p><nav>{nav}</nav>"]
    for name, blocks in sections:
        parts.append(f'<h2 id="{_anchor(name)}">{html.escape(name)}</h2>' + "".join(_html_block(b) for b in blocks))
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** (the only markdown the report's prose uses)."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _html_block(block: tuple) -> str:
    kind = block[0]
    if kind == "p":
        return f"<p>{_inline(block[1])}</p>"
    if kind == "list":
        return "<ul>" + "".join(f"<li>{_inline(t)}</li>" for t in block[1]) + "</ul>"
    if kind == "code":
        return f'<pre class="cmd">{html.escape(block[1])}</pre>'
    if kind == "table":
        if not len(block[1]):
            return "<p><em>None.</em></p>"
        body = _html_table(block[1])
        return f'<div class="{"scroll" if len(block) > 2 and block[2] else "tw"}">{body}</div>'
    if kind == "img":
        data = base64.b64encode(Path(block[1]).read_bytes()).decode("ascii")
        # A figure scales down to the screen's width (max-width: 100%); .fig scrolls if ever wider. It links to
        # its own PNG beside the page (write.write_report always writes the figures), which opens full size.
        name = html.escape(Path(block[1]).name)
        return (f'<div class="fig"><a href="{name}" title="{name}: open full size"><img '
                f'alt="{html.escape(Path(block[1]).stem)}" src="data:image/png;base64,{data}"></a></div>')
    if kind == "samples":
        cards = "".join(f"<figure><figcaption>{html.escape(h)}</figcaption><pre>{html.escape(t)}</pre></figure>"
                        for h, t in block[1])
        return f'<div class="samples">{cards or "<p><em>None.</em></p>"}</div>'
    raise ValueError(f"unknown block {kind!r}")


def _html_table(table: pd.DataFrame) -> str:
    # c-NAME classes: a narrow screen hides the columns it can spare (rank: the order says it)
    head = "".join(f'<th class="c-{_anchor(str(c))}">{html.escape(str(c))}</th>' for c in table.columns)
    cls = [(("t w " if c in WRAP_COLUMNS else "t ") if c in TEXT_COLUMNS else "") + f"c-{_anchor(str(c))}"
           for c in table.columns]
    rows = "".join("<tr>" + "".join(f'<td class="{k}">{_inline(str(v))}</td>' for k, v in zip(cls, row)) + "</tr>"
                   for row in table.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
