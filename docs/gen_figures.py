"""Draw the documentation's pictures with matplotlib (the PNGs are committed under docs/assets/).

    .venv/bin/python docs/gen_figures.py

* ``docs/assets/overview.png`` (the README's and the home page's picture): a replay of the shipped midpair-greedy
  workload's test split under the shipped ``cpu-midpair`` profile, computed now by ``specgym eval``: tokens/s of
  every fixed K against ``marginal``, ``predicted:midpair``, plain decoding and the clairvoyant oracle.
* ``docs/assets/results/PAGE.png``: one plot per results page, drawn from the page's own table that follows a
  ``<!-- plot: COLUMN -->`` comment (labels from the first column, values = the first number in COLUMN, or the
  first ratio such as ``1.036x`` in a column of ratios), so a plot shows exactly the figures its page states.

Part of the docs, not of the installed package.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = Path(__file__).resolve().parent
ASSETS = DOCS / "assets"
SAVE = {"metadata": {"Software": None}, "dpi": 110}
PLOT = re.compile(r"<!-- plot: (.+?) -->\s*\n+(\|.*?)(?:\n\n|\Z)", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
RATIO = re.compile(r"(-?\d+(?:\.\d+)?)x")


def overview(out: Path) -> None:
    """tokens/s vs fixed K on midpair-greedy (replay, shipped data), with the adaptive rows as lines."""
    specs = ",".join([*(f"fixed:{k}" for k in range(1, 9)), "marginal", "predicted:midpair"])
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "specgym", "eval", "--workload", "midpair-greedy", "--controllers",
                        specs, "--bootstrap", "0", "--no-plots", "--out", f"{tmp}/ev"], check=True,
                       capture_output=True)
        report = json.loads(Path(f"{tmp}/ev/report.json").read_text())
    tok = {r["controller"]: r["throughput_tok_s"] for r in report["rows"]}
    plain = tok["fixed:1"] / next(r["speedup_vs_ar"] for r in report["rows"] if r["controller"] == "fixed:1")
    ks = list(range(1, 9))
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.bar(ks, [tok[f"fixed:{k}"] for k in ks], color="#9db4d3", label="fixed K (what engines ship)")
    lines = [("oracle (clairvoyant limit)", report["oracle"]["throughput_tok_s"], "#555555", ":"),
             ("predicted:midpair (learned acceptance predictor)", tok["predicted:midpair"], "#c0392b", "-"),
             ("marginal (cost-aware rule)", tok["marginal"], "#e67e22", "--"),
             ("plain decoding", plain, "#333333", "-.")]
    for label, value, colour, style in lines:
        ax.axhline(value, color=colour, linestyle=style, label=f"{label}: {value:.0f}")
    ax.set_xlabel("draft length K (fixed for every round)")
    ax.set_ylabel("tokens/s (replay)")
    ax.set_xticks(ks)
    ax.set_ylim(0, report["oracle"]["throughput_tok_s"] * 1.35)
    ax.set_title("midpair-greedy test split, cpu-midpair profile (shipped data, replayed)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(out, **SAVE)
    plt.close(fig)


def table_plot(page: Path, column: str, table: str, out: Path) -> None:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    col = next((i for i, h in enumerate(header) if h.strip("*` ") == column.strip("*` ")), None)
    if col is None:
        raise SystemExit(f"{page.relative_to(DOCS)}: no column {column!r} in the table after its plot comment "
                         f"(columns: {header})")
    labels, values = [], []
    ratios = sum(bool(RATIO.search(r[col])) for r in body) * 2 > len(body)  # a column of ratios: plot only ratios
    for r in body:
        m = (RATIO if ratios else NUMBER).search(r[col].replace(",", ""))
        if m:
            labels.append(re.sub(r"[*`]", "", r[0])[:48])
            values.append(float(m.group(1) if ratios else m.group()))
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(labels) + 1.0))
    ax.barh(range(len(values)), values, color="#7f9cc7")
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(re.sub(r"[*`]", "", column), fontsize=8)
    if ratios:
        ax.axvline(1.0, color="#333333", linewidth=0.8)
    ax.set_title(page.stem, fontsize=8)
    fig.tight_layout()
    fig.savefig(out, **SAVE)
    plt.close(fig)


def main() -> int:
    (ASSETS / "results").mkdir(parents=True, exist_ok=True)
    overview(ASSETS / "overview.png")
    for page in sorted((DOCS / "results").glob("*.md")):
        m = PLOT.search(page.read_text())
        if m:
            table_plot(page, m.group(1).strip(), m.group(2), ASSETS / "results" / f"{page.stem}.png")
    print(f"wrote {ASSETS.relative_to(DOCS.parent)}/overview.png and the results plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
