"""The report as a user sees it (#30): a phone-width page scrolls tables in their own box and scales
figures; the forest plot's x label lies inside the figure; an 80-column table keeps its identifying
columns whole."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from anatomy_cli.report import figures, page, textable


def test_page_has_viewport_scroll_wrappers_and_scaling_images(tmp_path):
    png = tmp_path / "f.png"
    figures.plot_forest(pd.DataFrame(columns=["flip", "call", "margin"]), png)
    table = pd.DataFrame({"component": ["rope"], "interval": ["[+0.1, +0.2]"], "call": ["helps"]})
    out = page.html_page("t", "lead", [("Verdict", [("table", table, False), ("img", png)]),
                                       ("Runs", [("table", table, True)])])
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in out
    assert '<div class="tw"><table>' in out and '<div class="scroll"><table>' in out
    assert ".tw{overflow-x:auto" in out and "img{max-width:100%;height:auto}" in out
    assert "max-width:none" not in out  # no rule undoes the scaling on a narrow screen


def _verdict(n: int, group: str = "") -> pd.DataFrame:
    return pd.DataFrame([dict(rank=i + 1, flip=f"component{i}", direction="add-one" if i % 2 else "remove-one",
                              against="2017" if i % 2 else "LLaMA", group=group, gain=0.1 * i - 0.2,
                              adj_low=0.1 * i - 0.3, adj_high=0.1 * i - 0.1, margin=0.02, n_pairs=3,
                              call="helps" if i % 2 else "within noise") for i in range(n)])


@pytest.mark.parametrize("n", [1, 3, 12, 30])
@pytest.mark.parametrize("group", ["", "n_layer=4, d_model=128, ctx_len=256"])
@pytest.mark.parametrize("unit", ["bits/byte", "%"])
def test_forest_x_label_inside_the_figure(n, group, unit):
    fig = figures.forest_figure(_verdict(n, group), unit)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    box = fig.axes[0].xaxis.label.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height


def test_textable_at_80_keeps_identifying_columns_whole():
    heads = ["rank", "component", "change", "gain", "interval", "call", "seeds"]
    rows = [["1", "a-long-component-name", "removed from the LLaMA end", "+0.468", "[+0.354, +0.582]",
             "within noise", "3"]]
    fit = [("drop", "seeds"), ("drop", "rank"), ("cut", "component", 6), ("cut", "change", 7)]
    out = textable.table(heads, rows, 80, fit=fit)
    assert "a-long-component-name" in out and "within noise" in out and "component" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_textable_wraps_a_header_instead_of_cutting_it():
    out = textable.table(["name", "corpus tok/param"], [["tiny", "3.2"]], 15, fit=[("cut", "corpus tok/param", 3)])
    assert textable.ELLIPSIS not in out.splitlines()[0] + out.splitlines()[1]
    assert "corpus" in out and "tok/param" in out and "tiny" in out
