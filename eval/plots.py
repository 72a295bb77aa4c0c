"""PNG plots of an evaluation report (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PLOT_FILES = ("throughput.png", "k_over_time.png", "acceptance_by_category.png")


def _title(report: dict[str, Any], what: str) -> str:
    wl = report["workload"]
    return f"{what} — {wl['label']}, {wl['split']} split, profile {report['profile']['name']}"


def plot_throughput(report: dict[str, Any], path: Path) -> None:
    """Horizontal bars: throughput by controller, with the oracle and plain decoding as lines."""
    rows = report["rows"][::-1]
    names = [r["controller"] for r in rows]
    vals = [r["throughput_tok_s"] for r in rows]
    colors = ["tab:orange" if r["spec"].startswith("fixed:") else "tab:blue" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.8))
    ax.barh(names, vals, color=colors)
    ax.axvline(report["oracle"]["throughput_tok_s"], color="k", ls="--", label="oracle (clairvoyant)")
    ax.axvline(1000.0 / report["reference"]["t_ar_ms"], color="grey", ls=":", label="plain decoding")
    ax.set_xlabel("throughput (tokens/s, simulated)")
    ax.set_title(_title(report, "Throughput"), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_k_over_time(report: dict[str, Any], path: Path) -> None:
    """Draft cap per round along one request per category: adaptive controllers against the oracle."""
    traces = report["traces"]
    cats = list(traces)
    fig, axes = plt.subplots(len(cats), 1, figsize=(9, 2.4 * len(cats) + 0.6), squeeze=False)
    for ax, cat in zip(axes[:, 0], cats):
        t = traces[cat]
        o = np.array(t["oracle"])
        ax.step(o[:, 0], o[:, 1], where="post", color="k", lw=1.6, label="oracle")
        for name, rounds in t["controllers"].items():
            if not rounds:
                continue
            a = np.array(rounds)
            ax.step(a[:, 0], a[:, 2], where="post", lw=0.9, alpha=0.8, label=name)
        ax.set_ylabel("K (drafted)")
        ax.set_title(f"{cat}: request {t['request_id']} ({t['length']} tokens)", fontsize=9)
    axes[-1, 0].set_xlabel("completion position")
    axes[0, 0].legend(fontsize=7, ncol=4, loc="upper right")
    fig.suptitle(_title(report, "K over time"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_acceptance(report: dict[str, Any], path: Path) -> None:
    """Acceptance rate (accepted / drafted) per category for each controller, and the trace's mean p_accept."""
    cats = list(report["workload"]["mean_p_accept_by_category"])
    rows = [r for r in report["rows"] if r["mean_k"] > 0]
    width = 0.8 / (len(rows) + 1)
    x = np.arange(len(cats))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(cats) + 3), 4.2))
    ax.bar(x, [report["workload"]["mean_p_accept_by_category"][c] for c in cats], width, color="k",
           label="trace mean p_accept")
    for i, r in enumerate(rows, start=1):
        ax.bar(x + i * width, [r["categories"][c]["acceptance_rate"] for c in cats], width, label=r["controller"])
    ax.set_xticks(x + 0.4 - width / 2, cats)
    ax.set_ylim(0, 1)
    ax.set_ylabel("acceptance rate (accepted / drafted)")
    ax.set_title(_title(report, "Acceptance per category"), fontsize=9)
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    """All plots into ``folder``; returns their paths."""
    paths = [folder / name for name in PLOT_FILES]
    plot_throughput(report, paths[0])
    plot_k_over_time(report, paths[1])
    plot_acceptance(report, paths[2])
    return paths
