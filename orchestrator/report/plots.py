"""Per-cell plots as inline SVG (matplotlib, no pyplot state, no files, no network).

Left: each arm's legs as points, the spread as a bar from the slowest to the fastest leg, the median
as a tick. Right: the ratio of medians with its 95% interval against the tolerance band around the
estimate; the magnitude is binding only when the interval sits inside the band.
"""
from __future__ import annotations

import io
import re
import statistics

import matplotlib

matplotlib.use("Agg")  # before any backend is touched; reports render on headless boxes
from matplotlib.figure import Figure  # noqa: E402

_BINDING, _OWED, _BAND = "#2b7a3d", "#b5651d", "#cfe8d5"


def _svg(fig: Figure, salt: str) -> str:
    buf = io.StringIO()
    # A salt per plot keeps the SVG ids of several inlined plots apart, and the output reproducible.
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = re.sub(r"^.*?(?=<svg)", "", buf.getvalue(), flags=re.S)  # drop the XML prolog and doctype
    # Inline SVG in HTML5 needs no namespaces and no RDF metadata: the page names no URL at all.
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    # matplotlib numbers its element ids per figure (figure_1, axes_1): several plots on one page
    # would share them, so every id and every reference to one gets the plot's salt.
    text = re.sub(r'\bid="([^"]+)"', rf'id="{salt}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{salt}-\1)", text)
    return re.sub(r'href="#([^"]+)"', rf'href="#{salt}-\1"', text)


def _legs_axes(ax, arms: dict[str, dict], unit: str) -> None:
    names = list(arms)
    for y, name in enumerate(names):
        legs = arms[name]["legs"]
        if not legs:
            continue
        lo, hi = min(legs), max(legs)
        ax.hlines(y, lo, hi, color="#888", lw=6, alpha=0.35)
        ax.plot(legs, [y] * len(legs), "o", color="#1f4e79", ms=6, zorder=3)
        med = arms[name].get("median") or statistics.median(legs)
        ax.plot([med], [y], "|", color="k", ms=16, mew=2, zorder=4)
        ax.annotate(f"spread {(hi - lo) / lo:.2%}", (hi, y), xytext=(6, 6), textcoords="offset points",
                    fontsize=8, color="#444")
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.margins(x=0.25)
    ax.set_xlabel(f"{unit} per leg")
    ax.grid(axis="x", alpha=0.3)


def _ratio_axes(ax, claim: dict, tolerance: float, binding: bool) -> None:
    ratio, ci = claim["ratio"], claim.get("ci")
    ax.axvspan(ratio * (1 - tolerance), ratio * (1 + tolerance), color=_BAND, label=f"±{tolerance:.0%} band")
    color = _BINDING if binding else _OWED
    if ci and None not in ci:
        ax.errorbar([ratio], [0], xerr=[[ratio - ci[0]], [ci[1] - ratio]], fmt="D", color=color,
                    capsize=6, lw=2, label="ratio, 95% CI")
    else:
        ax.plot([ratio], [0], "D", color=color, label="ratio")
    ax.axvline(1.0, color="#999", ls="--", lw=1)
    ax.set_yticks([])
    ax.set_xlabel(f"{claim['winner']} / {claim['loser']}")
    ax.set_title("binding" if binding else "owed: not binding", color=color, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)


def cell_plot(arms: dict[str, dict], claim: dict | None, tolerance: float, binding: bool, salt: str,
              unit: str = "decode tok/s") -> str:
    """SVG text for one cell: legs and spread per arm, and the ratio against the tolerance band."""
    with_ratio = claim is not None and claim.get("ratio") is not None
    fig = Figure(figsize=(9.0 if with_ratio else 5.5, 1.3 + 0.6 * max(len(arms), 2)), layout="constrained")
    axes = fig.subplots(1, 2, width_ratios=[3, 2]) if with_ratio else [fig.subplots()]
    _legs_axes(axes[0], arms, unit)
    if with_ratio:
        _ratio_axes(axes[1], claim, tolerance, binding)
    return _svg(fig, salt)


# One colour per part, stable across arms and cells (the GEMMs in blues, cores in greens, the
# measured gaps in greys), so a part reads the same in every bar.
_PART_COLOURS = {"lm_head": "#b5651d", "tower.qkvo": "#1f4e79", "tower.gate_up": "#2e75b6", "tower.down": "#5b9bd5",
                 "tower.in_proj": "#9dc3e6", "tower.out_proj": "#c5d9ef", "delta_rule": "#2b7a3d",
                 "attention": "#70ad47", "norm": "#a9d18e", "embed": "#7f6084", "sample": "#b4a7d6",
                 "other": "#999999", "idle": "#cccccc", "host": "#cccccc"}
_FALLBACK = ("#e6b8af", "#f9cb9c", "#ffe599", "#b6d7a8", "#a2c4c9")


def attribution_plot(arms: list[dict], parts: list[str], salt: str) -> str:
    """SVG: one stacked bar per arm (ms per step of each part), and a tick at the step measured
    without the profiler, so the closure shows as the bar's end against the tick."""
    fig = Figure(figsize=(9.0, 1.2 + 0.55 * len(arms)), layout="constrained")
    ax = fig.subplots()
    spare = iter(_FALLBACK * 4)
    for y, arm in enumerate(arms):
        left = 0.0
        for name in parts:
            p = arm["parts"].get(name)
            if p is None or p["ms_per_step"] <= 0:  # a negative part (noise) cannot be stacked
                continue
            colour = _PART_COLOURS.get(name) or next(spare, "#dddddd")
            ax.barh(y, p["ms_per_step"], left=left, color=colour, edgecolor="white", lw=0.5,
                    label=None if name in _seen_labels(ax) else name)
            left += p["ms_per_step"]
        ax.plot([arm["total"]], [y], "|", color="k", ms=22, mew=2, zorder=4,
                label="step without the profiler" if y == 0 else None)
    ax.set_yticks(range(len(arms)), [a["name"] for a in arms])
    ax.set_ylim(-0.6, len(arms) - 0.4)
    ax.set_xlabel("ms per decode step (two-length difference)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=6, frameon=False)
    return _svg(fig, salt)


def _seen_labels(ax) -> set[str]:
    return set(ax.get_legend_handles_labels()[1])
