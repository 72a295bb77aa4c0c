"""Report files of an evaluation: ``report.json``, ``report.md`` and PNG plots, written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import KIND_ROWS, kind_row
from specgym.io import atomic_dir

COLUMNS = (
    ("controller", "controller", "{}"),
    ("throughput_tok_s", "tok/s", "{:.2f}"),
    ("speedup_vs_ar", "vs AR", "{:.3f}x"),
    ("speedup_vs_k4", "vs K=4", "{:.3f}x"),
    ("speedup_vs_best_fixed", "vs best fixed", "{:.3f}x"),
    ("oracle_ratio", "oracle ratio", "{:.3f}"),
    ("headroom_closed", "headroom closed", "{:+.1%}"),
    ("headroom_closed_informed", "headroom closed (informed)", "{:+.1%}"),
    ("draft_waste", "waste", "{:.3f}"),
    ("mean_accept_len", "accept len", "{:.2f}"),
    ("mean_k", "mean K", "{:.2f}"),
    ("tpot_ms_mean", "TPOT ms", "{:.2f}"),
    ("tpot_ms_p99", "TPOT p99", "{:.2f}"),
)


CI_COLUMNS = ("speedup_vs_ar", "speedup_vs_best_fixed")  # shown with their 95% interval in the markdown table


#: Headroom is closed toward the clairvoyant *chain* oracle; a clairvoyant tree is another limit, not a controller.
_LIMIT_ONLY = ("headroom_closed", "headroom_closed_informed", "prediction_decision_tok_s")


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    v = None if key in _LIMIT_ONLY and row.get("family") == "oracle" else row.get(key)
    if v is None:
        return "–"
    text = fmt.format(v)
    ci = (row.get("ci95") or {}).get(key)
    if key in CI_COLUMNS and ci is not None:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


INFORMED_LABEL = "**oracle:informed** (knows p_accept, not the draws)"


def _header(report: dict[str, Any], key: str, title: str) -> str:
    """A column's title naming the K it compares with: ``vs K=4`` is ``vs K=k_max`` below 4, the best fixed K."""
    if key == "speedup_vs_k4":
        return f"vs K={min(4, int(report.get('k_max', 4)))}"
    if key == "speedup_vs_best_fixed" and report.get("reference", {}).get("best_fixed_k") is not None:
        return f"vs best fixed (K={report['reference']['best_fixed_k']})"
    return title


def markdown_table(report: dict[str, Any]) -> str:
    """The report's main table: the two oracles first (the physical limit, then the limit of any controller that
    has to predict), then controllers by throughput."""
    head = "| " + " | ".join(_header(report, key, title) for key, title, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"
    trees = any(row.get("tree") for row in report["rows"])
    limit = report.get("drafter_oracle")
    label = ("clairvoyant limit of chain drafts; a tree can pass it" if trees else
             f"clairvoyant limit of the default drafter, {limit['drafters'][0]}, alone; drafter choice can pass it"
             if limit else "clairvoyant limit")
    lines = [head, sep]
    if limit:  # a drafter-choice evaluation: its limit is the clairvoyant choice among every drafter
        limit = dict(limit, controller=f"**drafter oracle** (clairvoyant limit of drafter choice among "
                                       f"{', '.join(limit['drafters'])})")
        lines.append("| " + " | ".join(_cell(limit, k, f) for k, _, f in COLUMNS) + " |")
    oracle = dict(report["oracle"], controller=f"**oracle** ({label})")
    lines.append("| " + " | ".join(_cell(oracle, k, f) for k, _, f in COLUMNS) + " |")
    if "informed_oracle" in report:
        informed = dict(report["informed_oracle"], controller=INFORMED_LABEL)
        lines.append("| " + " | ".join(_cell(informed, k, f) for k, _, f in COLUMNS) + " |")
    for row in report["rows"]:
        if (row.get("guard") or {}).get("handed"):  # ran outside its training range: see guard_section
            row = dict(row, controller=f"{row['controller']} †")
        lines.append("| " + " | ".join(_cell(row, k, f) for k, _, f in COLUMNS) + " |")
    return "\n".join(lines)


def headroom_section(report: dict[str, Any]) -> str:
    """The headroom split: *chance* (clairvoyant - informed) and, per controller, *prediction + decision*
    (informed - controller), with the headroom closed against both oracles."""
    h = report["headroom"]
    share = "" if h["chance_share"] is None else f", {h['chance_share']:.0%} of the best-fixed-to-clairvoyant " \
                                                  "headroom in time"
    lines = [
        "## Headroom split",
        "",
        f"Clairvoyant oracle {h['clairvoyant_tok_s']:.2f} tok/s, informed oracle {h['informed_tok_s']:.2f}, best "
        f"fixed K {h['best_fixed_tok_s']:.2f}. **Chance** (clairvoyant - informed) = {h['chance_tok_s']:.2f} tok/s"
        f"{share}: what knowing the draws adds, which no controller that has to predict can remove. What "
        f"prediction + decision can gain over the best fixed K: {h['removable_tok_s']:.2f} tok/s (informed - best "
        "fixed K).",
        "",
        "| controller | tok/s | chance tok/s | prediction + decision tok/s | headroom closed (clairvoyant) | "
        "headroom closed (informed) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        cells = [row["controller"], _cell(row, "throughput_tok_s", "{:.2f}"), f"{h['chance_tok_s']:.2f}",
                 _cell(row, "prediction_decision_tok_s", "{:+.2f}"), _cell(row, "headroom_closed", "{:+.1%}"),
                 _cell(row, "headroom_closed_informed", "{:+.1%}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tree_section(report: dict[str, Any]) -> str:
    """Every tree row against the fastest static tree of the run (paired 95% intervals)."""
    best = report["best_static_tree"]
    lines = [f"**Trees vs the best static tree** (`{best}`, the fastest exact static tree in this run):"]
    for row in report["rows"]:
        if row.get("tree") and "speedup_vs_best_static_tree" in row:
            lo, hi = (row.get("ci95") or {}).get("speedup_vs_best_static_tree") or (float("nan"), float("nan"))
            lines.append(f"- {row['controller']}: {row['speedup_vs_best_static_tree']:.3f}x [{lo:.3f}, {hi:.3f}]")
    return "\n".join(lines)


def _chooses_drafter(row: dict[str, Any]) -> bool:
    """A report row of a kind that names the drafter of each round (rows without a kind: no)."""
    kind = row.get("kind")
    return kind in KIND_ROWS and kind_row(kind).chooses_drafter


def drafter_section(report: dict[str, Any]) -> str:
    """Every drafter-choice row against the best single drafter at its best fixed K and the lookup rule (paired 95%
    intervals), and the share of the clairvoyant drafter choice's headroom over that single drafter it closes."""
    best = report["best_single_drafter"]
    rows = [r for r in report["rows"] if _chooses_drafter(r) and r.get("family") != "fixed"]
    base = next((r for r in report["rows"] if r["spec"] == best), None)
    base_tok = None if base is None else float(base["throughput_tok_s"])
    oracles = [r for r in rows if r.get("family") == "oracle"]  # the planning one first, then the per-round one
    oracles.sort(key=lambda r: r["spec"] != "drafter-oracle")
    lookup = report.get("lookup_rule")
    lines = [f"**Drafter choice vs the best single drafter** (`{best}`, the fastest single drafter at a fixed K in "
             f"this run){f' and vs `{lookup}`' if lookup else ''}; headroom = the share of the clairvoyant choice's "
             f"gain over `{best}` closed:"]
    for row in rows:
        ci = row.get("ci95") or {}
        lo, hi = ci.get("speedup_vs_best_single_drafter") or (float("nan"), float("nan"))
        text = f"- {row['controller']}: {row['speedup_vs_best_single_drafter']:.3f}x [{lo:.3f}, {hi:.3f}]"
        if lookup and "speedup_vs_lookup_rule" in row:
            llo, lhi = ci.get("speedup_vs_lookup_rule") or (float("nan"), float("nan"))
            text += f", vs {lookup} {row['speedup_vs_lookup_rule']:.3f}x [{llo:.3f}, {lhi:.3f}]"
        shares = []
        for oracle in oracles if base_tok is not None else []:
            gain = oracle["throughput_tok_s"] - base_tok
            if row is not oracle and gain > 0:
                shares.append(f"{(row['throughput_tok_s'] - base_tok) / gain:+.1%} of `{oracle['spec']}`'s")
        if shares:
            text += f", headroom closed {', '.join(shares)}"
        lines.append(text)
    return "\n".join(lines)


#: The ratios the without-loops section shows, each with its interval: (report key, label).
LOOP_FREE_RATIOS = (("speedup_vs_ar", "vs AR"), ("speedup_vs_best_fixed", "vs best fixed"),
                    ("speedup_vs_best_single_drafter", "vs best single drafter"),
                    ("speedup_vs_lookup_rule", "vs lookup rule"),
                    ("speedup_vs_best_static_tree", "vs best static tree"))


def without_loops_section(report: dict[str, Any]) -> str:
    """Every row's ratios on the requests whose answer does not loop (paired 95% intervals over those requests)."""
    loops = report["without_loops"]
    lines = [f"**Without the looping answers** ({loops['looped_requests']} of "
             f"{loops['looped_requests'] + loops['requests']} requests end in a repetition loop and are left out):"]
    for row in report["rows"]:
        figures = loops["rows"].get(row["spec"])
        if figures is None:
            continue
        cells = []
        for key, label in LOOP_FREE_RATIOS:
            if key in figures:
                lo, hi = figures["ci95"].get(key) or (float("nan"), float("nan"))
                cells.append(f"{label} {figures[key]:.3f}x [{lo:.3f}, {hi:.3f}]")
        lines.append(f"- {row['controller']}: " + ", ".join(cells))
    return "\n".join(lines)


def left_out_section(report: dict[str, Any]) -> str:
    """The rows ``all`` left out for this workload, and why (a controller that needs a signal the trace lacks is
    never run on a stand-in)."""
    return "\n".join(["**Left out of `all`:**", *(f"- {note}" for note in report["left_out"])])


def guard_section(report: dict[str, Any]) -> str:
    """The learned policies that ran outside the range of observations they saw in training, and how often their
    teacher decided instead."""
    lines = ["**† Outside their training range** (the teacher decided those rounds):"]
    for row in report["rows"]:
        g = row.get("guard") or {}
        if g.get("handed"):
            first = g.get("first_outside") or {}
            lines.append(f"- {row['controller']}: {g['share']:.1%} of its decisions handed to `{g['teacher']}` (first: "
                         f"{first.get('feature')} = {first.get('value', float('nan')):.4g}, trained "
                         f"[{first.get('low', float('nan')):.4g}, {first.get('high', float('nan')):.4g}])")
    return "\n".join(lines)


def markdown_report(report: dict[str, Any], plots: bool = True) -> str:
    """The whole ``report.md`` (``plots``: the report folder holds the PNG plots)."""
    wl, prof, ref = report["workload"], report["profile"], report["reference"]
    published = (wl.get("source") or {}).get("kind") == "published"
    synthetic = " **(synthetic workload)**" if wl["synthetic"] else \
        " **(a published trace replayed, not a live run)**" if published else ""
    return "\n".join([
        f"# specgym evaluation: {wl['label']}",
        "",
        f"- workload: `{wl['name']}`{synthetic}, split `{wl['split']}`: {wl['requests']} requests, "
        f"{wl['tokens']} tokens",
        f"- cost profile: `{prof['name']}` ({prof['source']}): {CostProfile.from_dict(prof).summary()}, "
        f"t_AR {ref['t_ar_ms']:g} ms",
        f"- seed {report['seed']}, k_max {report['k_max']}, best fixed K = {ref['best_fixed_k']}, "
        f"specgym {report['specgym_version']}",
        "- times are simulated by the replay engine from the cost profile; speedups are ratios of total time; "
        f"[lo, hi] = paired bootstrap 95% interval over requests ({report['bootstrap']['resamples']} resamples; "
        "every ratio's interval is in report.json under ci95); column meanings: docs/reference/report-columns.md",
        "",
        markdown_table(report),
        "",
        *([left_out_section(report), ""] if report.get("left_out") else []),
        *([guard_section(report), ""] if any((r.get("guard") or {}).get("handed") for r in report["rows"]) else []),
        *([tree_section(report), ""] if report.get("best_static_tree") else []),
        *([drafter_section(report), ""] if report.get("best_single_drafter") else []),
        *([without_loops_section(report), ""] if report.get("without_loops") else []),
        *([headroom_section(report), ""] if "headroom" in report and not report.get("drafter_oracle") else []),
        *(["## Notes", "", *(f"- {note}" for note in report["notes"]), ""] if report.get("notes") else []),
        *([PLOTS_LINE, ""] if plots else []),
    ])


PLOTS_LINE = "Plots: `throughput.png`, `k_over_time.png`, `acceptance_by_category.png`."


def write_report(report: dict[str, Any], out: Path, overwrite: bool = False, plots: bool = True) -> Path:
    """Write ``report.json``, ``report.md`` and the plots into ``out`` (all or nothing; no plots, no matplotlib)."""
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        (tmp / "report.md").write_text(markdown_report(report, plots))
        if plots:
            from specgym.eval.plots import write_plots  # matplotlib: only when plotting

            write_plots(report, tmp)
    return out
