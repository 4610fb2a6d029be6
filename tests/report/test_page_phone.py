"""report.html on a phone (issue 38): each figure links to its own PNG beside the page, which opens
full size, and a narrow screen keeps the seeds column (it hides only what the order already says)."""

from __future__ import annotations

import re

import pytest
from report_runs import called_sweep

from anatomy_cli.report import page, write
from anatomy_cli.report.build import build_report

pytestmark = pytest.mark.slow  # writes a whole report with figures: seconds


def test_every_figure_links_to_its_own_png_beside_the_page(tmp_path):
    called_sweep(tmp_path)
    paths = write.write_report(build_report(tmp_path), formats=("html",))
    html = paths["report.html"].read_text()
    figures = re.findall(r'<div class="fig">(.*?)</div>', html, re.S)
    assert figures and len(figures) == html.count("<img")
    for fig in figures:
        link = re.fullmatch(r'<a href="([^"]+\.png)" title="[^"]+: open full size"><img [^>]+></a>', fig)
        assert link, fig[:200]
        assert (paths["report.html"].parent / link.group(1)).is_file()  # the PNG the link opens


def test_a_narrow_screen_keeps_the_seeds_column():
    narrow = re.search(r"@media \(max-width:600px\)\{(.*?)\}\s*\.tw", page.STYLE, re.S).group(1)
    hidden = [rule.split("{")[0] for rule in narrow.split("}") if "display:none" in rule]
    assert hidden == [".c-rank"], hidden
