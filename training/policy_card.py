"""The card (``README.md``) of a shipped policy: what it was trained on, how, with which seeds, and how it did.

A shipped policy is one exported training run; its card also reports the other seeds trained with the same config
(their validation figures and, when a generalisation-suite report is given, their suite figures: mean and spread),
so a reader sees whether the shipped seed is typical. Run as (:mod:`specgym.commands.policy_card`)::

    python -m specgym.commands.policy_card data/policies/NAME --runs RUN_SEED0,RUN_SEED1,RUN_SEED2 \
        --suite out/suite-generalization/suite.json --suite-specs ppo:DIR0,ppo:DIR1,ppo:DIR2 [--force]

It ships the seed that is best on validation (``RUN/policy``, exported by ``specgym export``), copied into
``data/policies/NAME``, and writes the card beside it. The suite never picks the seed (that would tune to it).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import yaml

from specgym.agents.modes import get_mode
from specgym.envs.core.kinds import kind_row
from specgym.envs.workloads.domains import generalist_domains
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.io import atomic_dir, atomic_write_text, check_output
from specgym.paths import WORKLOADS_DIR
from specgym.training.run import read_run_state
from specgym.training.run_folder import RunFiles


def _fit_split(workload: str | None) -> str:
    """The split a policy of ``workload`` trained on (:attr:`Workload.fit_split`; ``train`` for a domain pool)."""
    if not workload:
        return "train"
    shipped = WORKLOADS_DIR / f"{workload}.parquet"
    try:
        return cached_workload(shipped if shipped.exists() else workload).fit_split
    except (SpecgymError, OSError):
        return "train"

def _seed_rows(runs: list[dict[str, Any]], shipped: str, second: str) -> list[str]:
    """One table row per seed: steps, wall time, best validation vs the best fixed K and ``second``, oracle ratio."""
    rows = []
    for r in runs:
        b, st = r["best"], r["state"]
        mark = " **(shipped)**" if r["run"] == shipped else ""
        rows.append(f"| {r['config'].get('seed')}{mark} | {r['run']} | {st.timesteps_done:,} | "
                    f"{st.wall_s / 60:.1f} min | {_fmt(b.get('speedup_vs_best_fixed'), 'x')} | "
                    f"{_fmt(b.get(second), 'x')} | {_fmt(b.get('oracle_ratio'))} |")
    return rows


def _run_record(run: Path) -> dict[str, Any]:
    """Config, state and summary of a run folder."""
    if not (run / "state.json").is_file():
        raise SpecgymError(f"{run}: not a training run (no state.json)")
    state = read_run_state(RunFiles(run))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    best = dict(state.best or {})
    summary = run / "summary.json"
    if summary.is_file():  # the kept model's full validation figures (the state's history keeps two ratios)
        val = json.loads(summary.read_text()).get("val") or {}
        best.setdefault("oracle_ratio", val.get("oracle_ratio", math.nan))
        for key in ("speedup_vs_sequoia", "speedup_vs_eagle-head"):  # tree runs (on the draft model; the head)
            if key in val:
                best.setdefault(key, val[key])
    return {"run": run.name, "config": cfg, "state": state, "best": best}


def _fmt(value: Any, suffix: str = "") -> str:
    """``1.234x``, or an en dash for a figure the run did not measure."""
    v = math.nan if value is None else float(value)
    return "–" if math.isnan(v) else f"{v:.3f}{suffix}"


def _mean_spread(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} (min {min(values):.3f})"


def card_markdown(name: str, meta: dict[str, Any], runs: list[dict[str, Any]], shipped: str,
                  suite: dict[str, Any] | None = None, suite_specs: list[str] | None = None,
                  distribution: dict[str, Any] | None = None, reproduce: str = "make policies") -> str:
    """The card's markdown (see the module docstring)."""
    mode = meta.get("mode") or runs[0]["config"].get("mode")
    if kind_row(get_mode(mode).kind).drafts_trees:
        return _tree_card(name, meta, runs, shipped, reproduce)
    L = _intro(name, meta, mode)
    L += _warning_section(meta)
    L += _distribution_section(meta.get("training", {}), distribution)
    L += _guard_section(meta)
    L += _training_section(meta.get("training", {}), runs, shipped, bool(distribution), bool(suite),
                           reproduce)
    if suite and suite_specs:
        L += _suite_section(suite, suite_specs, runs, shipped)
    L += ["## Limitations", "",
          "* Trained on replayed traces priced by cost models: live figures depend on how well the pair's measured "
          "profile predicts the machine (see the README's sim-to-real table).",
          "* The feature version is pinned: a specgym whose features changed refuses to load this policy.", ""]
    return "\n".join(L)


def _intro(name: str, meta: dict[str, Any], mode: str) -> list[str]:
    """The card's title, what the policy decides and reads, and how to use it by name."""
    return [f"# specgym policy `{name}`", "",
            f"A PPO policy (stable-baselines3, exported to numpy: `policy.npz` + `policy.json`, no pickle) in **{mode} "
            f"mode**: {get_mode(mode).decides}"
            + " It reads the cost profile and the request's verified history through the shared feature code "
              f"(feature version {meta.get('feature_version')}), so it needs no tuning per deployment."
            + (f" Its acceptance estimate of each draft token is the acceptance predictor "
               f"`{meta['predictor']['name']}`'s (embedded in `policy.json`, so it is the very predictor it was "
               f"trained with), where the decoding loop provides the predictor's signals."
               if meta.get("predictor") else ""), "",
            "Use it by name:", "", "```bash",
            f"specgym eval --controllers all,ppo:{name}",
            f"specgym generate --prompt 'def fibonacci(n):' --controller ppo:{name}",
            "```", "", "```python", "from specgym import make_controller",
            "from specgym.agents.hf_generate import generate_with_controller",
            f"out = generate_with_controller(target, draft, input_ids, make_controller('ppo:{name}'), "
            "max_new_tokens=128)", "```", ""]


def _distribution_section(tr: dict[str, Any], distribution: dict[str, Any] | None) -> list[str]:
    """What the policy trained on: the generalist's domain randomisation, or one workload (with its profile
    jitter)."""
    L = ["## Training distribution", ""]
    if not distribution:
        jitter = tr.get("config", {}).get("profile_jitter")
        return L + [f"Workload `{tr.get('workload')}` ({_fit_split(tr.get('workload'))} split)" + (
            f", priced with its own cost profile jittered (`profile_jitter: {jitter}`: draft cost, verify slope and "
            f"round overhead each scaled by a factor drawn log-uniformly in [1/{jitter}, {jitter}], a quarter of "
            "the episodes at the profile itself)" if jitter else "") + ".", ""]
    wls = distribution["workloads"]
    recorded = [w for w in wls if not w["synthetic"]]
    synth = [w for w in wls if w["synthetic"]]
    prof = distribution["profiles"]
    return L + [f"Every episode draws a workload and a cost profile (domain randomisation, "
                f"`envs/workloads/domains.py`): {len(synth)} **synthetic** workloads with random parameters "
                "(steady, three-category mixes and flat/rugged regimes; drafts calibrated, over- and under-confident)"
                + (f" and the *train* split of the recorded workload(s) {', '.join(w['name'] for w in recorded)} "
                   f"(each drawn {recorded[0]['weight'] / max(synth[0]['weight'], 1e-12):.0f}x as often as one "
                   "synthetic workload)" if recorded and synth else "") + "; profiles: cost ratio "
                f"{prof['cost_ratio'][0]}-{prof['cost_ratio'][1]} (log-uniform), verify slope "
                f"{prof['verify_slope_per_token'][0]}-{prof['verify_slope_per_token'][1]} per token, round overhead "
                f"{prof['overhead_share_of_t_ar'][0]}-{prof['overhead_share_of_t_ar'][1]} x t_AR; "
                f"{distribution['own_profile_share']:.0%} of episodes keep the workload's own profile.", ""]


def _warning_section(meta: dict[str, Any]) -> list[str]:
    """What the export warned of (a policy below its fixed reference or its teacher on validation, exported with
    ``--force``): said at the top of the card, not only in ``policy.json``."""
    warning = meta.get("warning")
    if not warning:
        return []
    return ["## Status: below its reference on validation", "",
            f"**{warning}.** The rule it is below is the one to deploy; this policy is shipped as the learned row of "
            "the comparisons.", ""]


def _guard_section(meta: dict[str, Any]) -> list[str]:
    """Where the policy hands its decisions to its teacher (nothing for a policy without a guard)."""
    guard = meta.get("guard")
    if not guard:
        return []
    return ["## Guard", "",
            f"Outside the range of observations it saw in training (`policy.json` `guard`, "
            f"{meta.get('guard_range') or 'recorded while training'}), its decisions are its teacher "
            f"`{guard['teacher']}`'s: it never runs on inputs it has no experience of (the evaluation report marks "
            "a row where that happened, with the share of decisions handed over).", ""]


def _training_section(tr: dict[str, Any], runs: list[dict[str, Any]], shipped: str, generalist: bool,
                      with_suite: bool, reproduce: str) -> list[str]:
    """How PPO trained the policy, one row per seed, and the command that reproduces it."""
    cfg = tr.get("config", {})
    L = ["## Training", "",
         f"PPO, {cfg.get('timesteps', 0):,} environment steps per seed (the shipped model is the one kept at "
         f"{tr.get('timesteps', 0):,}), net {cfg.get('net_arch')} {cfg.get('activation')}, "
         f"learning rate {cfg.get('learning_rate')} ({cfg.get('lr_schedule')}), entropy coefficient "
         f"{cfg.get('ent_coef')}" + (f"; the actor was first behaviour-cloned from `{cfg['bc_init']}` and the "
                                     f"critic warmed up for {cfg.get('bc_warmup', 0):,} steps"
                                     if cfg.get("bc_init") else "; from scratch") +
         (". The model kept is the best on the validation cells (synthetic workloads from an unseen pool seed and "
          "the recorded train workloads' val splits, each under two unseen randomised profiles)" if generalist
          else ". The model kept is the best on the workload's val split") + ". One torch thread.",
         "", "| seed | run | steps | wall time | best val: vs best fixed K | vs marginal | oracle ratio |",
         "|---|---|---:|---:|---:|---:|---:|"]
    L += _seed_rows(runs, shipped, "speedup_vs_marginal")
    return L + ["", f"Reproduce: `{reproduce}` (trains every seed, exports the best on validation"
                    + (", runs the suite" if with_suite else "") + " and writes this card).", ""]


def _suite_section(suite: dict[str, Any], suite_specs: list[str], runs: list[dict[str, Any]],
                   shipped: str) -> list[str]:
    """The generalisation suite's figures: mean and spread over the seeds, then the shipped seed per cell."""
    summ = [suite["summary"][s] for s in suite_specs if s in suite["summary"]]
    L = ["## Generalisation suite (held-out cells)", "",
         f"`specgym eval --suite generalization`: {len(suite['cells'])} cells, each held-out requests (a "
         "recorded workload never trained on, the test split of a trained one, or a synthetic preset with an "
         "unseen seed) priced with a cost profile never used as such in training; ratios are throughput ratios "
         "with paired bootstrap 95% intervals over requests. Mean ± standard deviation over the "
         f"{len(summ)} seeds:",
         "", "| figure | seeds |", "|---|---|",
         f"| geometric mean vs the best baseline in hindsight (per cell) | "
         f"{_mean_spread([s['geomean_vs_best_baseline'] for s in summ])} |",
         f"| worst cell vs the best baseline | {_mean_spread([s['worst_vs_best_baseline'] for s in summ])} |",
         f"| worst cell's interval low | {_mean_spread([s['worst_ci_low_vs_best_baseline'] for s in summ])} |",
         f"| geometric mean vs the best K-level baseline | "
         f"{_mean_spread([s['geomean_vs_best_k_level'] for s in summ])} |",
         f"| geometric mean vs `marginal` | {_mean_spread([s['geomean_vs_marginal'] for s in summ])} |",
         f"| mean oracle headroom closed | {_mean_spread([s['mean_headroom_closed'] for s in summ])} |", "",
         "Per cell, the shipped seed:", "",
         "| cell | best baseline in hindsight | vs best baseline [95% CI] | vs best K-level | vs marginal | "
         "oracle ratio | headroom closed |", "|---|---|---:|---:|---:|---:|---:|"]
    names = [r["run"] for r in runs]
    spec = suite_specs[names.index(shipped)] if shipped in names else suite_specs[0]
    for c in suite["cells"]:
        p = c["policies"][spec]
        ci = p["vs_best_baseline_ci95"]
        hc = "–" if p["headroom_closed"] is None else f"{p['headroom_closed']:+.1%}"
        L.append(f"| {c['cell']}{' *(synthetic)*' if c['synthetic'] else ''} | {c['best_baseline']} | "
                 f"{p['vs_best_baseline']:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") +
                 f" | {p['vs_best_k_level']:.3f}x | {p['vs_marginal']:.3f}x | {p['oracle_ratio']:.3f} | {hc} |")
    L.append("")
    return L


def _tree_card(name: str, meta: dict[str, Any], runs: list[dict[str, Any]], shipped: str, reproduce: str) -> str:
    """The card of a tree-mode policy (``tree-ppo:NAME``): trees drafted by the draft model (compared with
    ``tree-sequoia``) or by the draft head (compared with ``tree-eagle:fit@head``)."""
    tr = meta.get("training", {})
    cfg = tr.get("config", {})
    head = meta.get("drafter") is not None
    ref, key = ("tree-eagle:fit@head", "speedup_vs_eagle-head") if head else ("tree-sequoia", "speedup_vs_sequoia")
    profile = cfg.get("profile") or "the workload's own"
    where = _fit_split(tr.get("workload"))
    rows = ("val split's fit rows (`Workload.learning_requests`); the model kept is the best on its other val rows"
            if where == "val" else "train split; the model kept is the best on the workload's val split")
    values = meta.get("action_mapping", {}).get("values", [])
    dynamic = any(isinstance(s, str) for s in values)
    menu = ", ".join(s if isinstance(s, str) else "-".join(map(str, s)) or "plain"
                     for s in meta.get("action_mapping", {}).get("values", []))
    L = [f"# specgym policy `{name}`", "",
         "A PPO policy (stable-baselines3, exported to numpy: `policy.npz` + `policy.json`, no pickle) in **tree "
         "mode** (`specgym/SpecDecodeTree-v0`): per round it picks the draft tree from a menu of static shapes "
         + ("(per-depth widths) and EAGLE-2 rounds (`eagle:DEPTH:BEAM:M`, confidence-chosen trees): "
            if dynamic else "(per-depth widths: ") + f"{menu}{'' if dynamic else ')'}. It reads the cost profile "
         "and the request's verified history through the "
         f"shared feature code (feature version {meta.get('feature_version')}). Greedy decoding only (exact tree "
         "replay needs greedy traces with ranks)." + (
             " Its trees are drafted by the pair's **draft head** (`policy.json` `drafter: head`; the recording's "
             "`ranks_head`): it observes every round priced as the head's and without the spine's confidence and "
             "entropy (the recording holds none of the head's), in replay and live alike." if head else ""), "",
         *_warning_section(meta),
         "Use it by name (a tree controller):", "", "```bash",
         f"specgym eval --workload {tr.get('workload')}" + (f" --profile {cfg['profile']}" if cfg.get("profile")
                                                            else "") +
         (f" --split val --controllers tree-ppo:{name},{ref},fixed:3@head" if head else
          f" --controllers all,tree-ppo:{name}"), "```", "",
         "## Training", "",
         f"Workload `{tr.get('workload')}` ({rows}), rounds priced with {profile if not cfg.get('profile') else ''}"
         f"{'`' + cfg['profile'] + '`' if cfg.get('profile') else ''} profile. PPO, "
         f"{cfg.get('timesteps', 0):,} environment steps per seed (the shipped model is the one kept at "
         f"{tr.get('timesteps', 0):,}), net {cfg.get('net_arch')} {cfg.get('activation')}, learning rate "
         f"{cfg.get('learning_rate')} ({cfg.get('lr_schedule')}), entropy coefficient {cfg.get('ent_coef')}; from "
         "scratch. One torch thread.", "",
         f"| seed | run | steps | wall time | best val: vs best fixed K | vs {ref} | oracle ratio |",
         "|---|---|---:|---:|---:|---:|---:|"]
    L += _seed_rows(runs, shipped, key)
    L += ["", f"Reproduce: `{reproduce}` (trains, exports the best model on validation and writes this card).", "",
          "## Limitations", "",
          "* Trained on replayed traces priced by a cost profile" + ("" if head else " (an illustrative GPU-like one "
                                                                      "by default)") +
          ": live figures depend on the tree engine and hardware.",
          ("* Its EAGLE-2 entries are replayed as the rule is, approximately (off-path scores modelled): its training "
           "signal on them is modelled too; live, they are exact." if dynamic else
           "* The menu is static shapes chosen before the round's first draft forward: it cannot react to the "
           "round's draft distribution (the dynamic `tree-predicted:NAME` rule does)."),
          "* The feature version is pinned: a specgym whose features changed refuses to load this policy.", ""]
    return "\n".join(L)


def best_run(runs: list[Path]) -> Path:
    """The run whose kept model is best on validation (by the figure the runs kept it by)."""
    records = [_run_record(r) for r in runs]
    key = "speedup_vs_marginal" if records[0]["config"].get("domains") else "speedup_vs_best_fixed"
    scores = [r["best"].get(key, -math.inf) for r in records]
    return runs[scores.index(max(scores))]


def ship_policy(run: Path, policy_dir: Path, force: bool = False) -> None:
    """Copy ``run/policy`` (an exported artifact) to ``policy_dir``."""
    src = run / "policy"
    if not (src / "policy.json").is_file():
        raise SpecgymError(f"{src}: no exported policy (run specgym export {run} first)")
    check_output(policy_dir, force)
    with atomic_dir(policy_dir, overwrite=force, owner="specgym policy card", also_owns=("README.md",)) as tmp:
        for f in ("policy.json", "policy.npz"):
            (tmp / f).write_bytes((src / f).read_bytes())


def write_policy_card(policy_dir: Path, runs: list[Path], shipped: Path, suite: Path | None = None,
                      suite_specs: list[str] | None = None, reproduce: str = "make policies") -> Path:
    """Write ``policy_dir/README.md`` from the run folders (and a suite report); returns its path."""
    meta = json.loads((policy_dir / "policy.json").read_text())
    records = [_run_record(r) for r in runs]
    dist = None
    if records[0]["config"].get("domains"):
        dist = generalist_domains().describe()
    rep = json.loads(suite.read_text()) if suite else None
    text = card_markdown(policy_dir.name, meta, records, shipped.name, rep, suite_specs, dist, reproduce)
    path = policy_dir / "README.md"
    atomic_write_text(path, text, overwrite=True)
    return path
