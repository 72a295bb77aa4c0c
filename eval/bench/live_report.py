"""The live bench's last phase: each row's figures with paired intervals (:class:`LiveRow`), the comparisons (tree vs
chain, drafter choice vs the best single drafter), transformers' ``generate()``, the JSON result and the printed
table (:func:`report`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, astuple, dataclass
from typing import Any

import numpy as np
from rich.table import Table

from specgym.agents.specs import row_of
from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_static import StaticTree
from specgym.envs.engines.live.clock import timed
from specgym.eval.bench.live_config import LiveBenchConfig, fixed_draft_cap
from specgym.eval.bench.live_measure import PLAIN, LiveControllers, LiveSetup, Measurement
from specgym.eval.bench.live_predict import Prediction
from specgym.eval.stats import PairedBootstrap
from specgym.paths import portable_name


@dataclass
class LiveRow:
    """One controller's live figures.

    Attributes:
        controller: Its spec.
        tok_s: Live tokens/s (sum of per-prompt median times).
        speedup: Over plain decoding, with its paired 95% interval ``speedup_ci``.
        vs_best_fixed: Over the best fixed K, with ``vs_best_fixed_ci``; ``verdict`` is ``faster``, ``slower`` or
            ``tie`` (the interval contains 1).
        predicted_tok_s: The replay prediction: the controller's replayed rounds (decided under the profile
            controllers see) priced by the profile fitted to calibration rounds interleaved with the measurement
            (with drafter rows, the draft head's cost too, from head rounds interleaved the same way);
            ``measured_over_predicted`` = live tok/s / predicted (1 = exact). ``upfront_measured_over_predicted`` and
            ``micro_measured_over_predicted``: the same priced by the up-front fit and by the micro-benchmarks.
        acceptance: Accepted / drafted tokens (first repeat).
        greedy_identical: Every output equals plain decoding (greedy workloads; ``None`` when sampling, where
            outputs are equal in distribution only).
    """

    controller: str
    tok_s: float
    speedup: float
    speedup_ci: tuple[float, float] | None
    vs_best_fixed: float
    vs_best_fixed_ci: tuple[float, float] | None
    verdict: str
    predicted_tok_s: float
    measured_over_predicted: float
    micro_measured_over_predicted: float | None
    upfront_measured_over_predicted: float | None
    acceptance: float
    greedy_identical: bool | None


def verdict(ci: tuple[float, float] | None, point: float) -> str:
    """``faster`` / ``slower`` when the interval clears 1, else ``tie`` (no interval: by the point estimate)."""
    lo, hi = ci if ci is not None else (point, point)
    return "faster" if lo > 1.0 else "slower" if hi < 1.0 else "tie"


@dataclass
class _Paired:
    """The measured totals, the two references (plain decoding, the best fixed K) and the paired bootstrap."""

    specs: list[str]
    per_prompt: np.ndarray
    totals: np.ndarray
    plain: int
    best_fixed: int
    boot: PairedBootstrap

    @classmethod
    def of(cls, setup: LiveSetup, m: Measurement, resamples: int) -> _Paired:
        specs, totals = setup.specs, m.totals
        plain = specs.index(PLAIN)
        fixed_ix = [i for i, s in enumerate(specs) if i != plain and fixed_draft_cap(s)]
        best_fixed = min(fixed_ix, key=lambda i: totals[i])
        return cls(specs, m.per_prompt, totals, plain, best_fixed, PairedBootstrap(len(setup.prompts), resamples,
                                                                                   seed=0))

    def versus(self, ref: int, row: int) -> tuple[float, tuple[float, float] | None, str]:
        """Row ``row``'s speed over row ``ref`` (the ratio of their totals), its paired interval and verdict."""
        ratio = float(self.totals[ref] / self.totals[row])
        ci = self.boot.ratio_ci(self.per_prompt[ref], self.per_prompt[row])
        return ratio, ci, verdict(ci, ratio)


def _rows(setup: LiveSetup, m: Measurement, pred: Prediction, paired: _Paired) -> list[LiveRow]:
    """Every row's figures."""
    n_tok, totals, plain, best = setup.n_tok, paired.totals, paired.plain, paired.best_fixed
    rows = []
    for i, spec in enumerate(setup.specs):
        upfront_ms, pred_ms, micro_ms = pred.ms[spec]
        vs_best, vs_ci, word = paired.versus(best, i)
        rows.append(LiveRow(
            controller=spec, tok_s=n_tok / totals[i] * 1000.0, speedup=totals[plain] / totals[i],
            speedup_ci=paired.boot.ratio_ci(paired.per_prompt[plain], paired.per_prompt[i]),
            vs_best_fixed=totals[best] / totals[i], vs_best_fixed_ci=vs_ci,
            verdict="reference" if i == best else word,
            predicted_tok_s=n_tok / pred_ms * 1000.0, measured_over_predicted=pred_ms / totals[i],
            micro_measured_over_predicted=micro_ms / totals[i], upfront_measured_over_predicted=upfront_ms / totals[i],
            acceptance=m.accepted[i, 0] / max(m.accepted[i, 1], 1),
            greedy_identical=bool(m.identical[i]) if setup.greedy else None))
    return rows


def _subsets(setup: LiveSetup, paired: _Paired) -> dict[str, dict[str, Any]]:
    """Every row over plain decoding and over the whole set's best fixed K, with paired intervals, on each category's
    prompts and on the prompts whose answer does not end in a repetition loop (``no_loops``).

    The loop flag is :meth:`~specgym.envs.workloads.workload.Workload.looped` (the one definition) of the recorded
    answer: greedy answers equal the recording's, cut to ``--max-new-tokens`` where it is given. A shipped default
    below 1.0x plain on a category is a bug (issue 54), so the JSON keeps every cell and the summary names the rows
    below."""
    wl, req = setup.wl, np.asarray(setup.requests)
    cats = np.asarray(wl.category)[req]
    masks = {f"category:{c}": cats == c for c in dict.fromkeys(cats.tolist())}
    looped = wl.looped()
    if looped is not None:
        masks["no_loops"] = ~looped[req]
    out: dict[str, dict[str, Any]] = {}
    for name, mask in masks.items():
        idx = np.flatnonzero(mask)
        if not len(idx):
            continue
        per = paired.per_prompt[:, idx]
        tot, boot = per.sum(axis=1), PairedBootstrap(len(idx), paired.boot.resamples, seed=0)
        ref, best = paired.plain, paired.best_fixed
        out[name] = {"prompts": int(len(idx)), "rows": {spec: {
            "vs_plain": float(tot[ref] / tot[i]), "vs_plain_ci": boot.ratio_ci(per[ref], per[i]),
            "vs_best_fixed": float(tot[best] / tot[i]), "vs_best_fixed_ci": boot.ratio_ci(per[best], per[i]),
        } for i, spec in enumerate(paired.specs)}}
    return out


def below_plain(subsets: dict[str, dict[str, Any]]) -> list[str]:
    """``ROW on CATEGORY 0.93x [lo, hi]`` for every row whose speed over plain decoding is below 1 on a category."""
    out = []
    for name, sub in subsets.items():
        if not name.startswith("category:"):
            continue
        for spec, r in sub["rows"].items():
            if r["vs_plain"] < 1.0 and spec != PLAIN:
                out.append(f"{spec} on {name.split(':', 1)[1]} {r['vs_plain']:.3f}x" + _ci(r["vs_plain_ci"]))
    return out


def _chain_rows(setup: LiveSetup, rows: list[LiveRow]) -> list[LiveRow]:
    return [r for r in rows if r.controller not in setup.tree_specs and r.controller not in setup.drafter_specs]


def _comparisons(setup: LiveSetup, rows: list[LiveRow], paired: _Paired,
                 ctrls: LiveControllers) -> dict[str, Any]:
    """``tree_vs_chain`` (the fastest tree row, ``tree-chain:SPEC`` rows being chains, against the fastest chain row)
    and ``drafter_choice`` (the fastest drafter-choice row against the best single drafter at a fixed K: every fixed
    row, either drafter), each with its paired interval, or ``None``; the static trees' shapes and the rows whose
    prediction is approximate."""
    specs, protos = setup.specs, ctrls.protos
    out: dict[str, Any] = {"tree_vs_chain": None, "drafter_choice": None}
    trees = [r for r in rows if r.controller in setup.tree_specs and not isinstance(protos[r.controller], ChainAsTree)]
    if trees:
        best_tree = max(trees, key=lambda r: r.tok_s)
        best_chain = max(_chain_rows(setup, rows), key=lambda r: r.tok_s)
        ratio, ci, word = paired.versus(specs.index(best_chain.controller), specs.index(best_tree.controller))
        out["tree_vs_chain"] = {"tree": best_tree.controller, "chain": best_chain.controller, "ratio": ratio,
                                "ci": ci, "verdict": word}
    choosers = [r for r in rows if r.controller in setup.drafter_specs and row_of(r.controller).family != "fixed"]
    if choosers:
        best_choice = max(choosers, key=lambda r: r.tok_s)
        ratio, ci, word = paired.versus(paired.best_fixed, specs.index(best_choice.controller))
        out["drafter_choice"] = {"controller": best_choice.controller, "reference": specs[paired.best_fixed],
                                 "ratio": ratio, "ci": ci, "verdict": word}
    out["tree_shapes"] = {s: f"{c.tree.name} ({c.tree.nodes} nodes, depth {c.tree.depth})" for s in setup.tree_specs
                          if isinstance(c := protos[s], StaticTree)}
    out["approximate_predictions"] = [s for s in setup.tree_specs if protos[s].approximate]
    return out


def _errors(rows: list[LiveRow]) -> dict[str, float]:
    """The replay prediction's error |live/predicted - 1| over the rows, for each of its three pricings."""
    errors = [abs(r.measured_over_predicted - 1.0) for r in rows]
    micro = [abs((r.micro_measured_over_predicted or 1.0) - 1.0) for r in rows]
    upfront = [abs((r.upfront_measured_over_predicted or 1.0) - 1.0) for r in rows]
    return {"median": float(np.median(errors)), "max": float(np.max(errors)),
            "upfront_median": float(np.median(upfront)), "upfront_max": float(np.max(upfront)),
            "micro_median": float(np.median(micro)), "micro_max": float(np.max(micro))}


def _result(cfg: LiveBenchConfig, setup: LiveSetup, m: Measurement, pred: Prediction, paired: _Paired,
            rows: list[LiveRow], extra: dict[str, Any]) -> dict[str, Any]:
    """Every figure, as ``bench live --json`` writes it (``extra``: the comparisons and ``hf_generate``)."""
    import torch

    pair, specs, n_tok, totals = setup.pair, setup.specs, setup.n_tok, paired.totals
    best, n_p = max(rows, key=lambda r: r.tok_s), len(setup.prompts)
    return {
        "pair": setup.pair_name, "draft": portable_name(pair.draft_name), "target": portable_name(pair.target_name),
        "dtypes": pair.dtypes, "packed_linears": pair.packed,
        "kernels": {role: plan.to_dict() for role, plan in pair.kernels.items()},
        "target_forward_ms": {"1": setup.fwd[1], "2": setup.fwd[2]},
        "profile": setup.prof.to_dict(), "profile_note": setup.prof_note, "micro_profile": pred.micro.to_dict(),
        "pricing_profile": pred.pricing.to_dict(),
        "workload": setup.wl.name, "prompts": n_p, "tokens": n_tok, "repeats": cfg.repeats, "clock": "wall",
        "threads": torch.get_num_threads(), "plain_tok_s": n_tok / totals[paired.plain] * 1000.0,
        "rows": [asdict(r) for r in rows],
        "best_fixed_k": int(specs[paired.best_fixed].split(":")[1].partition("@")[0]),
        "best_fixed": specs[paired.best_fixed], "drafter_choice": extra["drafter_choice"],
        "best_fixed_speedup": totals[paired.plain] / totals[paired.best_fixed], "best_controller": best.controller,
        "best_speedup": best.speedup, "prediction_error": _errors(rows),
        "tree_vs_chain": extra["tree_vs_chain"], "tree_shapes": extra["tree_shapes"],
        "approximate_predictions": extra["approximate_predictions"], "hf_generate": extra["hf_generate"],
        "subsets": extra["subsets"],
        "bootstrap": {"resamples": cfg.resamples, "level": 0.95, "unit": "prompt"},
        "max_new_tokens": cfg.max_new_tokens or f"recorded lengths (mean {n_tok / n_p:.0f})",
        "times_ms": {s: m.times[i].tolist() for i, s in enumerate(specs)},
        # every interleaved calibration round, (drafted, context, drafting phase ms, round ms): a refit reprices offline
        "calibration_rounds": {"draft": [astuple(x) for x in m.cal_samples],
                               "head": [astuple(x) for x in m.head_samples]},
        "wall_s": time.perf_counter() - setup.t_start,
    }


def _print_table(console: Any, result: dict[str, Any], rows: list[LiveRow]) -> None:
    """The table of every row, fastest first."""
    table = Table(title=f"live, {result['pair']} ({result['dtypes']}), {result['prompts']} test prompts of "
                        f"{result['workload']}, {result['tokens']} tokens, median of {result['repeats']} per prompt, "
                        f"wall clock, {result['threads']} thread(s)")
    for col in ("controller", "live tok/s", "vs plain", f"vs best fixed ({result['best_fixed']}) [95% CI]",
                "verdict", "replay prediction tok/s", "live / predicted", "(up-front fit)", "(micro profile)",
                "acceptance", "greedy = plain"):
        table.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: -r.tok_s):
        ci = r.vs_best_fixed_ci
        table.add_row(r.controller, f"{r.tok_s:.1f}", f"{r.speedup:.3f}x",
                      f"{r.vs_best_fixed:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""), r.verdict,
                      f"{r.predicted_tok_s:.1f}", f"{r.measured_over_predicted:.3f}",
                      f"{r.upfront_measured_over_predicted:.3f}", f"{r.micro_measured_over_predicted:.3f}",
                      f"{r.acceptance:.2f}",
                      "n/a (sampling)" if r.greedy_identical is None else str(r.greedy_identical))
    console.print(table)


def _print_summary(console: Any, result: dict[str, Any]) -> None:
    """The lines under the table: the references and the prediction's error, then each comparison made."""
    e, best = result["prediction_error"], result["best_controller"]
    console.print(f"plain decoding {result['plain_tok_s']:.1f} tok/s; best fixed {result['best_fixed']}: "
                  f"{result['best_fixed_speedup']:.3f}x plain; best controller {best}: "
                  f"{result['best_speedup']:.3f}x; replay prediction error |live/predicted - 1|: median "
                  f"{100 * e['median']:.1f}%, max {100 * e['max']:.1f}% (up-front fit: median "
                  f"{100 * e['upfront_median']:.1f}%, max {100 * e['upfront_max']:.1f}%; "
                  f"micro-benchmarked profile: median {100 * e['micro_median']:.1f}%, max "
                  f"{100 * e['micro_max']:.1f}%)", highlight=False)
    if result["approximate_predictions"]:
        console.print(f"{', '.join(result['approximate_predictions'])}: live rounds exact; replay prediction "
                      "approximate (off-path scores modelled from draft_topk)", highlight=False)
    if result["tree_shapes"]:
        console.print("static trees: " + "; ".join(f"{k} = {v}" for k, v in result["tree_shapes"].items()),
                      highlight=False)
    if (dc := result["drafter_choice"]) is not None:
        console.print(f"drafter choice (live, this machine): fastest drafter-choice row {dc['controller']} "
                      f"runs {dc['ratio']:.3f}x the best single drafter at a fixed K ({dc['reference']})"
                      + _ci(dc["ci"]) + f": {dc['verdict']}", highlight=False)
    if (tvc := result["tree_vs_chain"]) is not None:
        console.print(f"tree vs chain (live, this machine): fastest tree {tvc['tree']} runs {tvc['ratio']:.3f}x the "
                      f"fastest chain {tvc['chain']}" + _ci(tvc["ci"]) + f": {tvc['verdict']}", highlight=False)
    _print_subsets(console, result)
    if (hf := result["hf_generate"]) is not None:
        console.print(f"transformers generate(assistant_model=...) with {hf['controller']}: "
                      f"{hf['assisted_tok_s']:.1f} tok/s vs plain generate() {hf['plain_tok_s']:.1f} tok/s "
                      f"({hf['assisted_tok_s'] / hf['plain_tok_s']:.3f}x), outputs identical: {hf['identical']}",
                      highlight=False)


def _print_subsets(console: Any, result: dict[str, Any]) -> None:
    """The rows on the answers that do not loop (over plain and the best fixed K), and every row below plain decoding
    on a category (all cells: the JSON's ``subsets``)."""
    subs, best = result["subsets"], result["best_fixed"]
    if (nl := subs.get("no_loops")) is not None:
        looping = result["prompts"] - nl["prompts"]
        cells = [f"{spec} {r['vs_plain']:.3f}x plain, {r['vs_best_fixed']:.3f}x {best}" + _ci(r["vs_best_fixed_ci"])
                 for spec, r in nl["rows"].items() if spec != PLAIN]
        console.print(f"without the looping answers ({looping} of {result['prompts']} prompts left out): "
                      + "; ".join(cells), highlight=False)
    below = below_plain(subs)
    console.print("below plain decoding on a category: " + ("; ".join(below) if below else "none"), highlight=False)


def _ci(ci: tuple[float, float] | None) -> str:
    return f" [95% CI {ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def report(console: Any, cfg: LiveBenchConfig, setup: LiveSetup, m: Measurement, pred: Prediction,
           ctrls: LiveControllers) -> dict[str, Any]:
    """Every row's figures and the comparisons, transformers' ``generate()`` with the best chain controller (unless
    ``cfg.hf_generate`` is off); printed as a table and returned as the bench's result."""
    paired = _Paired.of(setup, m, cfg.resamples)
    rows = _rows(setup, m, pred, paired)
    extra = _comparisons(setup, rows, paired, ctrls)
    extra["subsets"] = _subsets(setup, paired)
    extra["hf_generate"] = None
    if cfg.hf_generate:  # transformers' assisted generation drafts chains: the best chain controller
        best_chain = max(_chain_rows(setup, rows), key=lambda r: r.tok_s)
        extra["hf_generate"] = hf_generate(setup.pair, setup.prompts[:6], setup.lengths[:6],
                                           ctrls.fresh(best_chain.controller), setup.prof)
    result = _result(cfg, setup, m, pred, paired, rows, extra)
    _print_table(console, result, rows)
    _print_summary(console, result)
    return result


def hf_generate(pair: Any, prompts: list[list[int]], lengths: list[int], controller: Any, profile: Any) -> dict:
    """transformers' generate(): plain, and assisted with ``controller`` choosing K (wall clock, greedy)."""
    import torch

    from specgym.agents.hf_generate import generate_with_controller

    plain_ms = assisted_ms = 0.0
    identical = True
    for ids, n in zip(prompts, lengths):
        x = torch.tensor([ids], device=pair.target.device)
        kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  eos_token_id=None, pad_token_id=pair.tokenizer.pad_token_id)
        dev = pair.target.device
        t0 = timed(dev)
        ref = pair.target.generate(x, **kw)
        plain_ms += (timed(dev) - t0) * 1000
        draft_eos = pair.draft.generation_config.eos_token_id
        pair.draft.generation_config.eos_token_id = None  # the assistant would stop at its own EOS
        try:
            t0 = timed(dev)
            out = generate_with_controller(pair.target, pair.draft, x, controller, profile=profile, **kw)
            assisted_ms += (timed(dev) - t0) * 1000
        finally:
            pair.draft.generation_config.eos_token_id = draft_eos
        identical &= bool(torch.equal(out, ref))
    n_tok = sum(lengths)
    return {"prompts": len(prompts), "plain_tok_s": n_tok / plain_ms * 1000, "assisted_tok_s": n_tok / assisted_ms
            * 1000, "identical": identical, "controller": controller.name}
