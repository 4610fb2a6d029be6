"""The report's figures (matplotlib's object API, Agg canvas, no pyplot; no torch).

  colour           one colour per component, from its name: the same in every figure
  plot_forest      each effect's gain with the interval its call is made from, ranked, one marker per
                   call, the margin's band (the verdict; the speed effects of a timing pass)
  plot_curves      small multiples: a panel per component and direction, the variant (component
                   colour) against its end (grey); val solid, train faint
  plot_eval_effects  each component's paired effect at every evaluation against tokens seen
  plot_expert_load   a mixture of experts' routing: each layer's share of tokens per expert against 1/E
  plot_lr_sensitivity  a tuned study's LR curves: selection loss against log2 LR of both configs of
                   each component, each config's chosen LR marked
  worth_forest_figure  each arm's compute multiplier per rung with its interval, on a log axis around 1x
  law_figure       each end's law: its rung means and seeds against compute, the fitted law and beyond

Colours. The built-ins take tab10 in table order (rmsnorm blue, prenorm orange, rope green, swiglu
red, gqa purple, ...); any other name (a spec's `wd0`, the eleventh built-in) takes a colour of
tab20b picked by a CRC of its name, so a component has its colour in every report of every study.
"""

from __future__ import annotations

import io
import math
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, FuncFormatter, LogLocator, NullFormatter

from anatomy_cli.report import stats
from anatomy_cli.report.frames import UNIT
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.roles import ADD_ONE, VERB
from anatomy_cli.store.runs import atomic_write_bytes

END_COLOUR = "#555555"  # the end a variant is compared with
# One marker per call (stats.py): (marker, filled). Decided calls are filled.
CALL_MARKERS = {stats.HELPS: (">", True), stats.HURTS: ("<", True), stats.NEGLIGIBLE: ("D", True),
                stats.SMALL: ("s", False), stats.UNDECIDED: ("o", False), stats.TOO_FEW: ("X", False)}
# The report shows figures at most this wide (document.STYLE: body 1300 px less padding) at dpi 100,
# so a figure no wider than WIDTH_IN is shown 1:1 and font sizes >= "small" (8.3 pt) are >= 10 px.
DPI, WIDTH_IN = 100, 12.5
MAX_COLUMNS = 4


def colour(name: str) -> str:
    """A hex colour for a component name: tab10 by built-in position, else tab20b by a CRC of the name."""
    from matplotlib.colors import to_hex

    i = comp.BUILTIN_NAMES.index(name) if name in comp.BUILTIN_NAMES else -1
    if 0 <= i < 10:
        return to_hex(colormaps["tab10"](i))
    return to_hex(colormaps["tab20b"](zlib.crc32(name.encode()) % 20))


def save(fig: Figure, path: Path) -> Path:
    """The PNG written atomically (a full disk or an interrupt leaves the old figure, no torn one)."""
    FigureCanvasAgg(fig)  # attach an Agg canvas explicitly: no backend switching, no pyplot
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    atomic_write_bytes(path, png.getvalue())
    return Path(path)


def _title(fig: Figure, text: str, ncols: int) -> None:
    """A suptitle wrapped to the figure's width (about 13 characters per inch at this size)."""
    fig.suptitle(textwrap.fill(text, max(40, int(11 * _width(ncols)))), fontsize="medium")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


# --------------------------------------------------------------------------- verdict


def plot_forest(verdict: pd.DataFrame, path: Path, unit: str = UNIT) -> Path:
    return save(forest_figure(verdict, unit), path)


def forest_figure(verdict: pd.DataFrame, unit: str = UNIT) -> Figure:
    """Each effect's gain (positive = the component helps) with the interval its call is made from,
    one row per component and direction in verdict order; a grey band of +-margin (the smallest
    effect that matters, the verdict's `margin`) and one marker style per call (CALL_MARKERS)."""
    fig = Figure(figsize=(WIDTH_IN * 0.8, 1.6 + 0.45 * max(2, len(verdict))), layout="constrained")
    ax = fig.add_subplot()
    if verdict.empty:
        _empty(ax, "no paired runs")
        return fig
    y = np.arange(len(verdict))
    margin = float(verdict["margin"].iloc[0])
    if math.isfinite(margin) and margin > 0:
        size = f"{margin:.1f}%" if unit == "%" else f"{margin:.3f}"
        ax.axvspan(-margin, margin, color="#dddddd", zorder=0, label=f"±{size}: smaller effects do not matter")
    ax.axvline(0.0, color="black", linewidth=0.8, zorder=1)
    for yi, r in zip(y, verdict.itertuples()):
        c = colour(r.flip)
        if math.isfinite(r.adj_low):
            ax.plot([r.adj_low, r.adj_high], [yi, yi], color=c, linewidth=2.2, solid_capstyle="butt", zorder=2)
        marker, filled = CALL_MARKERS.get(r.call, CALL_MARKERS[stats.UNDECIDED])
        ax.plot([r.gain], [yi], marker, color=c, markersize=9, zorder=3, markeredgewidth=1.8,
                markerfacecolor=c if filled else "white", gid=f"call:{r.call}")
    lo, hi = forest_limits(verdict, margin)
    ax.set_xlim(lo, hi)
    _mark_off_axis(ax, verdict, y, lo, hi, unit)
    labels = [f"{r.flip} ({'added to' if r.direction == 'add-one' else 'removed from'} {r.against})"
              + (f" [{r.group}]" if r.group else "") for r in verdict.itertuples()]
    ax.set_yticks(y, labels)
    for tick, r in zip(ax.get_yticklabels(), verdict.itertuples()):
        tick.set_color(colour(r.flip))
    ax.invert_yaxis()
    what = "speed gain (% tokens/s with it vs without)" if unit == "%" else f"gain in best val loss ({unit})"
    # Two lines, and wrapped at the figure's edge besides: long row labels leave the axes narrow and
    # off-centre, and one line of this was cut at both ends (#30).
    ax.set_xlabel(f"{what}; > 0: the component helps\nline: the adjusted interval the call is made from", wrap=True)
    ax.grid(axis="x", alpha=0.3)
    handles = [Line2D([], [], linestyle="none", marker=m, color="#333333", markersize=8, markeredgewidth=1.5,
                      markerfacecolor="#333333" if f else "white", label=call)
               for call, (m, f) in CALL_MARKERS.items() if call in set(verdict["call"])]
    band = ax.get_legend_handles_labels()[0]
    fig.legend(handles=band + handles, loc="outside upper center", ncols=min(6, len(handles) + len(band)),
               fontsize="small", frameon=False)
    return fig


OUTLIER_WIDTH = 4.0  # an interval this many times wider than the called ones' median runs off the axis


def forest_limits(verdict: pd.DataFrame, margin: float) -> tuple[float, float]:
    """The forest plot's x range: every gain, 0 and +-margin, and the informative intervals, padded 8 %.

    Informative: the interval of a called row (n_pairs >= stats.MIN_PAIRS; a two-seed interval, t at 1
    degree of freedom, may be 20x wider) no wider than OUTLIER_WIDTH times the median width of the called
    rows' intervals, or than that times the margin band's width where it is wider (one run left on the
    unigram plateau, report/plateau.py, makes its effects' intervals 8 nats wide). Any other interval runs
    off the axis, its far ends marked and printed (_mark_off_axis), so that one wide interval cannot
    squeeze the rest onto 0 and hide the margin's band."""
    called = verdict[verdict["n_pairs"] >= stats.MIN_PAIRS]
    low, high = called["adj_low"].to_numpy(float), called["adj_high"].to_numpy(float)
    width = high - low
    finite = np.isfinite(width)
    if finite.any():  # an interval within a few margins' width is always informative
        typical = max(float(np.median(width[finite])), 2 * margin if math.isfinite(margin) else 0.0)
        keep = finite & (width <= OUTLIER_WIDTH * typical)
        low, high = low[keep], high[keep]
    values = np.concatenate([verdict["gain"].to_numpy(float), low, high, [margin, -margin, 0.0]])
    values = values[np.isfinite(values)]
    lo, hi = float(values.min()), float(values.max())
    pad = 0.08 * (hi - lo or 1.0)
    return lo - pad, hi + pad


def _mark_off_axis(ax, verdict: pd.DataFrame, y, lo: float, hi: float, unit: str) -> None:
    """An interval that runs past the axis: an arrow at each edge it crosses, and its numbers printed above
    its line (gid 'off-axis:FLIP:DIRECTION', the arrows 'off-axis-arrow:...')."""
    fmt = "{:+.1f}%" if unit == "%" else "{:+.3f}"
    span = hi - lo
    for yi, r in zip(y, verdict.itertuples()):
        if not (math.isfinite(r.adj_low) and math.isfinite(r.adj_high)) or (r.adj_low >= lo and r.adj_high <= hi):
            continue
        c, gid = colour(r.flip), f"{r.flip}:{r.direction}"
        for edge, inward, off in ((lo, lo + 0.04 * span, r.adj_low < lo), (hi, hi - 0.04 * span, r.adj_high > hi)):
            if off:
                ax.annotate("", xy=(edge, yi), xytext=(inward, yi), gid=f"off-axis-arrow:{gid}",
                            arrowprops={"arrowstyle": "-|>", "color": c, "lw": 2.2, "shrinkA": 0, "shrinkB": 0})
        left, right = r.adj_low < lo, r.adj_high > hi
        x, ha = (lo + 0.01 * span, "left") if left and not right else (hi - 0.01 * span, "right") if right and \
            not left else ((lo + hi) / 2, "center")
        ax.text(x, yi - 0.3, f"interval [{fmt.format(r.adj_low)}, {fmt.format(r.adj_high)}] runs off the axis",
                ha=ha, va="bottom", fontsize="small", color=c, gid=f"off-axis:{gid}")


# --------------------------------------------------------------------------- curves


def _width(ncols: int) -> float:
    """Inches for a row of ncols panels: about 3 in each, never wider than the report shows 1:1."""
    return min(WIDTH_IN, 3.0 * ncols + 0.6)


def _grid(n_panels_per_row: list[int]):
    ncols = max(1, min(MAX_COLUMNS, max(n_panels_per_row, default=1)))
    nrows = sum(max(1, math.ceil(k / ncols)) for k in n_panels_per_row) or 1
    return nrows, ncols


def plot_curves(curves: pd.DataFrame, panels: list[dict], path: Path, value: str = "loss") -> Path:
    """Small multiples: one panel per (direction, component), the variant's runs in the component's
    colour against its end's runs in grey, mean over seeds. value 'loss': val solid with markers,
    train faint (smoothed); value 'grad_norm': the train-step gradient norm (smoothed, log scale).

    panels: [{"flip", "direction", "title", "ref": [run ids], "var": [run ids]}], in display order.
    """
    directions = list(dict.fromkeys(p["direction"] for p in panels))
    per_row = [sum(p["direction"] == d for p in panels) for d in directions]
    nrows, ncols = _grid(per_row)
    fig = Figure(figsize=(_width(ncols), 2.7 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    data = curves[np.isfinite(curves[value].to_numpy(dtype=float))] if len(curves) else curves
    if not panels:
        _empty(axes[0][0], "no runs with a role (reference end, add-one, all-on end, remove-one)")
        for ax in axes.flat[1:]:
            ax.set_axis_off()
        return save(fig, path)
    row0, used = 0, set()
    for d, k in zip(directions, per_row):
        mine = [p for p in panels if p["direction"] == d]
        for j, p in enumerate(mine):
            ax = axes[row0 + j // ncols][j % ncols]
            used.add(id(ax))
            _panel(ax, data, p, value)
        row0 += max(1, math.ceil(k / ncols))
    for ax in axes.flat:
        if id(ax) not in used:
            ax.set_axis_off()
    _limits(axes[0][0], data, value)
    if value != "loss":  # plain numbers at 1-2-5 on the log axis, not 6x10^0
        axes[0][0].yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes[0][0].yaxis.set_major_formatter(FormatStrFormatter("%g"))
        axes[0][0].yaxis.set_minor_formatter(NullFormatter())
    what = ("val loss (solid, mean over seeds) and train loss (faint, smoothed), nats/token" if value == "loss"
            else "gradient norm per step (smoothed, mean over seeds)")
    _title(fig, f"{what}; grey = the end the component is compared with", ncols)
    fig.supxlabel("step")
    return save(fig, path)


def _mean_curve(data: pd.DataFrame, run_ids: list[str], split: str, value: str) -> pd.Series:
    part = data[data["run_id"].isin(run_ids) & (data["split"] == split)]
    if part.empty:
        return pd.Series(dtype=float)
    curve = part.groupby("step")[value].mean().sort_index()
    if split == "train" and len(curve) > 50:
        curve = curve.rolling(max(2, len(curve) // 50), center=True, min_periods=1).mean()
    return curve


def _panel(ax, data: pd.DataFrame, p: dict, value: str) -> None:
    c = colour(p["flip"])
    for ids, col, name in ((p["ref"], END_COLOUR, p.get("ref_name", "end")),
                           (p["var"], c, p.get("var_name", p["flip"]))):
        if value == "loss":
            train = _mean_curve(data, ids, "train", value)
            val = _mean_curve(data, ids, "val", value)
            if len(train):
                ax.plot(train.index, train.to_numpy(), color=col, alpha=0.3, linewidth=1.0)
            if len(val):
                ax.plot(val.index, val.to_numpy(), ".-", color=col, linewidth=1.6, markersize=3, label=name)
        else:
            g = _mean_curve(data, ids, "train", value)
            if len(g):
                ax.plot(g.index, g.to_numpy(), color=col, linewidth=1.2, label=name)
    if value != "loss":
        ax.set_yscale("log")
    ax.set_title(p["title"], fontsize="small", color=c)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")


def _limits(ax, data: pd.DataFrame, value: str) -> None:
    if value != "loss" or data.empty:
        return
    val = data.loc[data["split"] == "val", value]
    train = data.loc[data["split"] == "train", value]
    if len(val):  # a diverged run's huge loss, or step 0's, should not flatten everyone else's curve
        top = float(val.quantile(0.98)) if len(val) > 20 else float(val.max())
        low = float(min(val.min(), train.quantile(0.02) if len(train) else val.min()))
        ax.set_ylim(low - 0.03 * abs(low), top * 1.03)


# --------------------------------------------------------------------------- effects over training


def plot_eval_effects(eval_effects: pd.DataFrame, path: Path) -> Path:
    """Per component: its gain in val loss at every evaluation (add-one solid, remove-one dashed),
    mean over seeds with the raw 95% interval as a band, against tokens seen."""
    flips = list(dict.fromkeys(eval_effects["flip"]))
    nrows, ncols = _grid([len(flips)])
    fig = Figure(figsize=(_width(ncols), 2.8 * nrows + 1.0), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    if not flips:
        _empty(axes[0][0], "no paired runs")
    for ax, flip in zip(axes.flat, flips):
        c = colour(flip)
        rows = eval_effects[eval_effects["flip"] == flip]
        ax.axhline(0.0, color="black", linewidth=0.8)
        for (direction, group), cell in rows.groupby(["direction", "group"], sort=False):
            cell = cell[cell["step"] > 0].sort_values("step")  # step 0: untrained, no effect yet
            x = cell["tokens"].to_numpy(float) if cell["tokens"].notna().all() else cell["step"].to_numpy(float)
            style = "-" if direction == ADD_ONE else "--"
            name = VERB[direction] + (f" [{group}]" if group else "")
            ax.plot(x, cell["gain"].to_numpy(float), style, color=c, linewidth=1.6, label=name)
            lo, hi = cell["raw_low"].to_numpy(float), cell["raw_high"].to_numpy(float)
            if np.isfinite(lo).any():
                ax.fill_between(x, lo, hi, color=c, alpha=0.15, linewidth=0)
        ax.set_title(flip, fontsize="small", color=c)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(flips):]:
        ax.set_axis_off()
    from matplotlib.ticker import EngFormatter

    axes[0][0].xaxis.set_major_formatter(EngFormatter(sep=""))  # 400k, 800k, 1.2M (axes share x)
    fig.supxlabel("tokens seen")
    fig.supylabel(f"gain in val loss ({UNIT}); > 0: helps")
    _title(fig, "effect at every evaluation, paired by seed: solid = added to the reference end, dashed = "
                "removed from the all-on end; band = raw 95% interval over seeds", ncols)
    return save(fig, path)


# --------------------------------------------------------------------------- effects across scale


def plot_scale(by_size: pd.DataFrame, trends: pd.DataFrame, path: Path) -> Path:
    return save(scale_figure(by_size, trends), path)


def scale_figure(by_size: pd.DataFrame, trends: pd.DataFrame) -> Figure:
    """One small multiple per component: its gain in best val loss at each size (added solid, removed
    dashed, a few percent apart so the intervals do not hide each other) with the adjusted interval its
    call is made from, against non-embedding parameters on one shared log axis whose ticks are the
    sizes; the margin's band and the scale call in each panel's title."""
    flips = list(dict.fromkeys([*trends["flip"], *by_size["flip"]]))  # the order of the trend table
    flips = [f for f in flips if (by_size["flip"] == f).any()]
    nrows, ncols = _grid([len(flips)])
    ncols = min(ncols, 3)  # three across keeps each panel's ticks (size names and counts) readable
    nrows = max(1, math.ceil(len(flips) / ncols))
    fig = Figure(figsize=(_width(ncols), 2.9 * nrows + 1.1), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True)
    if not flips:
        _empty(axes[0][0], "no effects at two sizes or more")
    sizes = by_size.drop_duplicates("size").sort_values("non_embedding_params")
    margin = float(trends["margin"].iloc[0]) if len(trends) else math.nan
    for ax, flip in zip(axes.flat, flips):
        c = colour(flip)
        ax.axhline(0.0, color="black", linewidth=0.8)
        if math.isfinite(margin) and margin > 0:
            ax.axhspan(-margin, margin, color="#dddddd", zorder=0)
        said = []
        for (series, direction), cell in by_size[by_size["flip"] == flip].groupby(["series", "direction"], sort=False):
            cell = cell.sort_values("non_embedding_params")
            x = cell["non_embedding_params"].to_numpy(float) * 10 ** (-0.02 if direction == ADD_ONE else 0.02)
            word = VERB[direction]
            lo, hi = cell["adj_low"].to_numpy(float), cell["adj_high"].to_numpy(float)
            gain = cell["gain"].to_numpy(float)
            ax.errorbar(x, gain,
                        yerr=[np.where(np.isfinite(lo), gain - lo, 0), np.where(np.isfinite(hi), hi - gain, 0)],
                        fmt="o-" if direction == ADD_ONE else "s--", color=c, linewidth=1.5, markersize=5, capsize=3,
                        markerfacecolor=c if direction == ADD_ONE else "white",
                        label=word + (f" [{series}]" if series else ""))
            trend = trends[(trends["flip"] == flip) & (trends["direction"] == direction) & (trends["series"] == series)]
            if len(trend):
                said.append(f"{word}: {trend['call'].iloc[0]}")
        ax.set_xscale("log")
        ax.set_title("\n".join([flip] + said), fontsize="small", color=c)
        ax.grid(alpha=0.3)
        if by_size["series"].nunique() > 1:  # several series: each panel names its lines
            ax.legend(fontsize="small", loc="best")
    for ax in list(axes.flat)[len(flips):]:
        ax.set_axis_off()
    from matplotlib.ticker import NullLocator

    ticks = sizes["non_embedding_params"].to_numpy(float)
    labels = [f"{r.size}\n{_count(r.non_embedding_params)}" for r in sizes.itertuples()]
    for i, ax in enumerate(axes.flat):  # shared x: the same ticks, the sizes, named under each column's last panel
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(ticks, labels)
        ax.xaxis.set_tick_params(labelbottom=i + ncols >= len(flips))
    if len(ticks):
        axes[0][0].set_xlim(ticks.min() / 10 ** 0.15, ticks.max() * 10 ** 0.15)
    fig.supxlabel("non-embedding parameters (log scale): one tick per size")
    fig.supylabel(f"gain in best val loss ({UNIT}); > 0: helps")
    _title(fig, "each component's gain at each size (filled circles, solid: added; open squares, dashed: "
                "removed), with the interval its call is made from; grey band: smaller effects do not matter; "
                "title: the call across sizes", ncols)
    return fig


def _count(n: float) -> str:
    """98,304 -> '98k', 1,250,000 -> '1.25M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


# --------------------------------------------------------------------------- mixture of experts


def plot_expert_load(loads: list[tuple[str, list[list[float]]]], path: Path) -> Path:
    """A panel per MoE run: each layer's share of routed tokens per expert, experts ordered by load
    within the layer (an expert's index means nothing across layers), against the uniform 1/E
    (dashed). A balanced router keeps every bar near the line; a collapsed one has a few tall bars.

    loads: [(title, [layer][expert] shares)], in display order.
    """
    nrows, ncols = _grid([len(loads)])
    fig = Figure(figsize=(3.4 * ncols + 0.6, 2.6 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    if not loads:
        _empty(axes[0][0], "no mixture-of-experts runs")
    for ax, (title, load) in zip(axes.flat, loads):
        shares = -np.sort(-np.asarray(load, dtype=float), axis=1)  # [L, E], largest first
        L, E = shares.shape
        width = 0.8 / L
        for layer, row in enumerate(shares):
            ax.bar(np.arange(1, E + 1) + (layer - (L - 1) / 2) * width, row, width,
                   color=colormaps["viridis"](layer / max(1, L - 1)), label=f"layer {layer}")
        ax.axhline(1 / E, color="black", linestyle="--", linewidth=1.0, label=f"uniform 1/{E}")
        ax.set_title(f"{title}\nbusiest expert {shares.max():.2f}", fontsize="small")
        ax.set_xticks(range(1, E + 1))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="xx-small", ncols=2)
    for ax in list(axes.flat)[len(loads):]:
        ax.set_axis_off()
    fig.supxlabel("expert, by load within its layer")
    fig.supylabel("share of routed tokens")
    _title(fig, "routing of each mixture of experts: the fixed validation windows through the best weights", ncols)
    return save(fig, path)


# --------------------------------------------------------------------------- fair learning rates


def plot_lr_sensitivity(arms: dict, panels: list[dict], path: Path) -> Path:
    """A tuned study's LR curves: a panel per component and direction, the selection loss against log2 LR
    of its end's config (grey) and its variant's (the component's colour), each config's chosen LR marked
    (a star; an open circle at the best of a config not tuned), the initial loss dashed.

    arms: {config name: {"lrs", "losses", "lr", "initial_loss"}} (tune.json's arms); panels: [{"flip",
    "title", "end", "variant"}] (lr_comparison.panels), in display order.
    """
    nrows, ncols = _grid([len(panels)])
    fig = Figure(figsize=(_width(max(2, ncols)), 2.7 * nrows + 1.1), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    if not panels:
        _empty(axes[0][0], "no component with both configs selected")
    for j, p in enumerate(panels):
        ax = axes[j // ncols][j % ncols]
        for name, col in ((p["end"], END_COLOUR), (p["variant"], colour(p["flip"]))):
            arm = arms.get(name)
            if arm is None:
                continue
            x, y = np.log2(np.asarray(arm["lrs"], dtype=float)), np.asarray(arm["losses"], dtype=float)
            ax.plot(x, y, ".-", color=col, linewidth=1.4, markersize=4, label=name)
            best = int(np.argmin(y))
            if arm["lr"] is not None:
                ax.plot([math.log2(arm["lr"])], [y[list(arm["lrs"]).index(arm["lr"])]], "*", color=col,
                        markersize=12, markeredgecolor="black", markeredgewidth=0.5)
            else:
                ax.plot([x[best]], [y[best]], "o", color=col, markersize=9, fillstyle="none")
            ax.axhline(arm["initial_loss"], color="#999999", linewidth=0.8, linestyle="--")
        ax.set_title(p["title"], fontsize="small", color=colour(p["flip"]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    _title(fig, "selection loss (best val loss, mean over the selection seeds) against log2 LR; star: the LR chosen; "
           "ring: the best of a config not tuned; dashed: the initial loss", max(2, ncols))
    fig.supxlabel("log2 learning rate")
    return save(fig, path)


# --------------------------------------------------------------------------- worth (report/worth.py)


def worth_forest_figure(multipliers: pd.DataFrame) -> Figure:
    """Each arm's compute (or data) multiplier at each rung with the interval its call is made from, on a log
    axis around 1x (worth.WORTH_COLUMNS rows, in their order); a grey band of 1/margin..margin, one marker
    per call (CALL_MARKERS); an extrapolated multiplier hollow and grey (shown, not called)."""
    fig = Figure(figsize=(WIDTH_IN * 0.8, 1.6 + 0.38 * max(2, len(multipliers))), layout="constrained")
    ax = fig.add_subplot()
    if multipliers.empty:
        _empty(ax, "no multipliers")
        return fig
    y = np.arange(len(multipliers))
    margin = float(multipliers["margin"].iloc[0])
    ax.axvspan(1 / margin, margin, color="#dddddd", zorder=0, label=f"1/{margin:g}..{margin:g}x: does not matter")
    ax.axvline(1.0, color="black", linewidth=0.8, zorder=1)
    for yi, r in zip(y, multipliers.itertuples()):
        c = "#999999" if r.extrapolated else colour(r.flip)
        if math.isfinite(r.low) and math.isfinite(r.high) and r.low > 0:
            ax.plot([r.low, r.high], [yi, yi], color=c, linewidth=2.2, solid_capstyle="butt", zorder=2)
        marker, filled = CALL_MARKERS.get(r.call, ("o", False))
        if math.isfinite(r.multiplier) and r.multiplier > 0:
            ax.plot([r.multiplier], [yi], marker, color=c, markersize=8, zorder=3, markeredgewidth=1.6,
                    markerfacecolor=c if filled else "white", gid=f"call:{r.call}")
    ax.set_xscale("log")
    times = FuncFormatter(lambda v, _: f"{v:.3g}x")  # 1.1x, not 1.1 x 10^0
    ax.xaxis.set_major_formatter(times)
    ax.xaxis.set_minor_formatter(times)
    ax.set_yticks(y, [f"{r.flip} {'added to' if r.direction == ADD_ONE else 'removed from'} {r.against}, {r.rung}"
                      for r in multipliers.itertuples()])
    ax.invert_yaxis()
    what = "compute" if multipliers["axis"].iloc[0] == "compute" else "data"
    ax.set_xlabel(f"{what} multiplier: the reference end's {what} to reach the arm's loss / the arm's {what}\n"
                  "line: the interval the call is made from; grey: extrapolated (no call)", wrap=True)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.legend(loc="outside upper center", frameon=False, fontsize="small")
    return fig


def plot_worth(multipliers: pd.DataFrame, path: Path) -> Path:
    return save(worth_forest_figure(multipliers), path)


def plot_law(laws: pd.DataFrame, ladder: pd.DataFrame, path: Path) -> Path:
    return save(law_figure(laws, ladder), path)


def law_figure(laws: pd.DataFrame, ladder: pd.DataFrame) -> Figure:
    """One panel per end: its rung means and seeds (grey) against cost on a log axis, each arm's mean at its
    own cost (a cross in its colour: below the law, worth more than 1x), the fitted law over the ladder's
    range (solid) and a decade beyond it (dashed). laws: worth.LAW_COLUMNS rows; ladder: the
    LADDER_COLUMNS frame they were fitted on."""
    fig = Figure(figsize=(_width(max(2, len(laws))), 3.4), layout="constrained")
    axes = fig.subplots(1, max(1, len(laws)), squeeze=False)[0]
    if laws.empty:
        _empty(axes[0], "no law fitted")
        return fig
    col = "flops" if laws["axis"].iloc[0] == "compute" else "tokens"
    for ax, law in zip(axes, laws.itertuples()):
        end = ladder[(ladder["direction"] == law.direction) & (ladder["flip"] == "")]
        ax.plot(end[col], end["loss"], ".", color="#aaaaaa", markersize=4, label="seeds")
        means = end.groupby(col)["loss"].mean()
        ax.plot(means.index, means.to_numpy(), "o", color=END_COLOUR, label="rung mean")
        arms = ladder[(ladder["direction"] == law.direction) & (ladder["flip"] != "")]
        for flip, points in arms.groupby("flip", sort=False):  # each arm's mean at its own cost
            at = points.groupby("rung")[[col, "loss"]].mean()
            ax.plot(at[col], at["loss"], "x", color=colour(flip), label=flip)
        for lo, hi, style in ((law.low, law.high, "-"), (law.low / 10, law.low, "--"), (law.high, law.high * 10, "--")):
            c = np.geomspace(lo, hi, 50)
            ax.plot(c, law.floor + law.scale * (c / law.unit) ** -law.alpha, style, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"{law.against}: L = {law.floor:.3g} + {law.scale:.3g} (C/{law.unit:.2g})^-{law.alpha:.3g}",
                     fontsize="small")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="small")
    fig.supxlabel("FLOPs per run" if col == "flops" else "tokens per run")
    fig.supylabel(f"best val loss ({UNIT})")
    return fig
