"""PNG plots of an evaluation report (matplotlib, headless).

* ``throughput.png``: throughput per controller with its paired 95% interval; fixed K, rule-based and learned
  controllers in distinct colours (legend below the axes), the clairvoyant and informed oracles and plain decoding
  as reference lines, the headroom split shaded: *chance* (clairvoyant - informed) and the part prediction +
  decision can remove (informed - best fixed K).
* ``k_over_time.png``: small multiples, one row per adaptive controller and one column per category: the draft
  length it chose along one request against the clairvoyant oracle's (grey) and the informed oracle's (dotted).
* ``acceptance_by_category.png``: acceptance rate (accepted / drafted) per controller, one marker per category,
  the trace's mean acceptance probability as a dashed line per category.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from specgym.envs.core.kinds import FAMILY_STYLE, FamilyName  # noqa: E402

PLOT_FILES = ("throughput.png", "k_over_time.png", "acceptance_by_category.png")
#: Colour and legend label per controller family (the spec table's ``family`` of each row).
FAMILIES = FAMILY_STYLE
CATEGORY_STYLE = [("tab:blue", "o"), ("tab:orange", "s"), ("tab:green", "^"), ("tab:purple", "D"),
                  ("tab:brown", "v"), ("tab:pink", "P")]


def _title(report: dict[str, Any], what: str) -> str:
    wl = report["workload"]
    return f"{what} — {wl['label']}, {wl['split']} split, profile {report['profile']['name']}"


def _family(row: dict[str, Any]) -> FamilyName:
    """A row's family, as the spec table gave it (``rule`` for a controller of your own)."""
    family = row.get("family")
    return family if family in FAMILIES else "rule"


def plot_throughput(report: dict[str, Any]) -> Figure:
    """Horizontal bars: throughput by controller with 95% intervals; both oracles and plain decoding as lines, the
    headroom split (chance, prediction + decision) as shaded bands."""
    rows = report["rows"][::-1]
    ar_tps = 1000.0 / report["reference"]["t_ar_ms"]
    height = 0.32 * len(rows) + 2.6
    fig, ax = plt.subplots(figsize=(8.5, height))
    y = np.arange(len(rows))
    for family, (color, label) in FAMILIES.items():
        idx = [i for i, r in enumerate(rows) if _family(r) == family]
        if not idx:
            continue
        vals = np.array([rows[i]["throughput_tok_s"] for i in idx])
        err = None
        cis = [(rows[i].get("ci95") or {}).get("speedup_vs_ar") for i in idx]
        if all(c is not None for c in cis):
            lo = np.array([c[0] for c in cis]) * ar_tps  # type: ignore[index]
            hi = np.array([c[1] for c in cis]) * ar_tps  # type: ignore[index]
            err = np.vstack([np.maximum(vals - lo, 0), np.maximum(hi - vals, 0)])
        ax.barh(y[idx], vals, xerr=err, color=color, label=label, capsize=2, error_kw={"lw": 0.8})
    ax.set_yticks(y, [r["controller"] for r in rows], fontsize=8)
    clairvoyant = report["oracle"]["throughput_tok_s"]
    ax.axvline(clairvoyant, color="k", ls="--", label="oracle (clairvoyant)")
    if "headroom" in report:
        h = report["headroom"]
        ax.axvline(h["informed_tok_s"], color="tab:green", ls="-.", label="oracle:informed (knows p_accept)")
        ax.axvspan(h["informed_tok_s"], clairvoyant, color="0.85", lw=0, zorder=0,
                   label="chance (clairvoyant - informed)")
        ax.axvspan(h["best_fixed_tok_s"], h["informed_tok_s"], color="tab:green", alpha=0.08, lw=0, zorder=0,
                   label="prediction + decision (informed - best fixed K)")
    ax.axvline(ar_tps, color="k", ls=":", label="plain decoding")
    ax.set_xlabel("throughput (tokens/s, simulated from the cost profile); bars: paired bootstrap 95% interval")
    ax.set_title(_title(report, "Throughput"), fontsize=9)
    fig.legend(loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))  # two legend rows below the axes
    return fig


def plot_k_over_time(report: dict[str, Any]) -> Figure:
    """Small multiples: the draft length each adaptive controller chose along one request per category."""
    traces = report["traces"]
    family = {r["spec"]: _family(r) for r in report["rows"]}
    cats = list(traces)
    names = list(dict.fromkeys(n for t in traces.values() for n, r in t["controllers"].items() if r))
    n_rows, n_cols = max(len(names), 1), max(len(cats), 1)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.2 * n_cols + 0.6, 1.05 * n_rows + 1.2), squeeze=False,
                             sharey=True)
    k_max = report["k_max"]
    for col, cat in enumerate(cats):
        t = traces[cat]
        o = np.array(t["oracle"])
        for row, name in enumerate(names):
            ax = axes[row, col]
            ax.fill_between(o[:, 0], o[:, 1], step="post", color="0.82", lw=0)
            if t.get("informed"):
                inf = np.array(t["informed"])
                ax.step(inf[:, 0], inf[:, 1], where="post", lw=0.8, ls=":", color="tab:green")
            rounds = t["controllers"].get(name)
            if rounds:
                a = np.array(rounds)
                color = FAMILIES[_family({"family": family.get(name)})][0]
                ax.step(a[:, 0], a[:, 2], where="post", lw=0.9, color=color)
            ax.set_ylim(-0.3, k_max + 0.5)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))  # K is a whole number: no 2.5 ticks
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
            if row == 0:
                ax.set_title(f"{cat}: {t['request_id']} ({t['length']} tokens)", fontsize=8)
        axes[-1, col].set_xlabel("completion position", fontsize=8)
    fig.suptitle(_title(report, "Drafted tokens per round (line) against the clairvoyant oracle's K (grey) and the "
                                "informed oracle's (dotted); adaptive controllers only (a fixed K is a flat line)"),
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_acceptance(report: dict[str, Any]) -> Figure:
    """Acceptance rate per controller, one marker per category; the trace's mean p_accept as dashed lines."""
    means = report["workload"]["mean_p_accept_by_category"]
    cats = list(means)
    rows = [r for r in report["rows"] if r["mean_k"] > 0][::-1]
    fig, ax = plt.subplots(figsize=(8.5, 0.3 * len(rows) + 2.2))
    y = np.arange(len(rows))
    for i, cat in enumerate(cats):
        color, marker = CATEGORY_STYLE[i % len(CATEGORY_STYLE)]
        ax.scatter([r["categories"][cat]["acceptance_rate"] for r in rows], y, color=color, marker=marker, s=22,
                   label=f"{cat}", zorder=3)
        if means[cat] is not None:  # a per-start trace has no per-position acceptance
            ax.axvline(means[cat], color=color, ls="--", lw=0.9, label=f"{cat}: trace mean p_accept")
    ax.set_yticks(y, [r["controller"] for r in rows], fontsize=8)
    ax.set_xlim(0, 1)
    ax.grid(axis="x", lw=0.4, alpha=0.5)
    ax.set_xlabel("acceptance rate (accepted / drafted)")
    ax.set_title(_title(report, "Acceptance per category"), fontsize=9)
    fig.legend(loc="lower center", ncol=min(2 * len(cats), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    """All plots into ``folder``; returns their paths."""
    paths = []
    for name, plot in zip(PLOT_FILES, (plot_throughput, plot_k_over_time, plot_acceptance)):
        fig = plot(report)
        fig.savefig(folder / name, dpi=110, bbox_inches="tight")  # long controller labels stay inside
        plt.close(fig)
        paths.append(folder / name)
    return paths
