"""What an acceptance predictor is worth: prediction quality and decoding speed, per signal group, with and without
repetition loops (``specgym predictor eval``).

On one split of a workload (test by default), against references trained on the same train split:

* **prediction**: AUC, log loss and calibration (ECE) of the predictor vs *calibrated confidence* (the ``conf``-only
  logistic: Platt scaling of the draft's confidence), overall and on the requests with / without a repetition loop;
* **speed** (replay, common random numbers, :func:`specgym.eval.harness.evaluate`): the ``predicted:`` controller
  vs ``marginal``, the best fixed K and both oracles, each ratio with a paired bootstrap 95% interval over requests;
  headroom closed against the clairvoyant and the informed oracle;
* **ablation**: one predictor (of the same model kind) per cumulative signal group set — conf; + position; + shape;
  + lookup; + hidden when recorded — each with its prediction figures and its controller's speed;
* **loops**: every speed ratio recomputed on the requests whose completion loops and on those that do not, so no
  conclusion rests on the loops alone (a small pair loops far more than a large model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.baselines.marginal import MarginalStop
from specgym.baselines.planned_stop import PlannedStop
from specgym.baselines.predicted_marginal import PredictedMarginal
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, SignalSource
from specgym.envs.core.cost import CostProfile
from specgym.envs.workloads.trace_format import Workload
from specgym.errors import SpecgymError
from specgym.eval.harness import INFORMED, EvalConfig, evaluate
from specgym.eval.stats import PairedBootstrap
from specgym.paths import MODEL_ROOTS
from specgym.training.predictor import predictor_metrics, request_loops, select_predictor, workload_dataset

ABLATION: tuple[tuple[str, ...], ...] = (
    ("conf",),
    ("conf", "position"),
    ("conf", "shape", "position"),
    ("conf", "shape", "position", "lookup"),
    ("conf", "shape", "position", "lookup", "hidden"),
)


def _prediction(pred: AcceptancePredictor, wl: Workload, split: str) -> dict[str, Any]:
    data = workload_dataset(wl, split, pred.groups)
    p = pred.predict_matrix(data.x)
    out: dict[str, Any] = {"all": predictor_metrics(p, data.y)}
    for label, mask in (("loops", data.loops), ("no_loops", ~data.loops)):
        out[label] = predictor_metrics(p[mask], data.y[mask]) if mask.any() else None
    return out


def _ratio(boot: PairedBootstrap, ref: np.ndarray, t: np.ndarray) -> dict[str, Any]:
    ci = boot.ratio_ci(ref, t)
    return {"ratio": float(ref.sum() / t.sum()), "ci95": ci}


def _speed(times: dict[str, np.ndarray], names: list[str], best_fixed: str, mask: np.ndarray, bootstrap: int,
           tokens: np.ndarray) -> dict[str, Any]:
    """Throughput and paired ratios (vs marginal, best fixed K, the oracles) on the requests in ``mask``."""
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return {"requests": 0}
    boot = PairedBootstrap(len(idx), bootstrap, seed=0)
    sel = {k: v[idx] for k, v in times.items()}
    n_tok = float(tokens[idx].sum())
    out: dict[str, Any] = {"requests": int(len(idx)), "best_fixed": best_fixed, "controllers": {}}
    for name in names + ["marginal", best_fixed, INFORMED, "oracle"]:
        t = sel[name]
        row: dict[str, Any] = {"tok_s": n_tok / float(t.sum()) * 1000.0}
        if name not in (INFORMED, "oracle"):
            row["vs_marginal"] = _ratio(boot, sel["marginal"], t)
            row["vs_best_fixed"] = _ratio(boot, sel[best_fixed], t)
            gap = float(sel[best_fixed].sum())
            for oracle, key in (("oracle", "headroom_closed"), (INFORMED, "headroom_closed_informed")):
                room = gap - float(sel[oracle].sum())
                row[key] = (gap - float(t.sum())) / room if room > 0 else float("nan")
        out["controllers"][name] = row
    return out


def predictor_report(wl: Workload, predictor: AcceptancePredictor, split: str = "test",
                     profile: CostProfile | None = None, ablation: bool = True, bootstrap: int = 2000,
                     extra_controllers: tuple[Any, ...] = ()) -> dict[str, Any]:
    """Every figure of the module docstring for ``predictor`` on ``wl`` (see :mod:`specgym.training.predictor`)."""
    active, note = predictor.for_source(SignalSource.of_workload(wl, MODEL_ROOTS))  # another pair's is refused
    if active is None:
        raise SpecgymError(f"{note}: nothing of predictor {predictor.name!r} can be measured on it")
    conf_only, _ = select_predictor(wl, ("conf",), name="calibrated-confidence", kinds=("logistic",))
    predictors: dict[str, AcceptancePredictor] = {f"predicted:{predictor.name}": predictor}
    has_hidden = wl.hidden_sketch is not None
    if ablation:
        for groups in ABLATION:
            if "hidden" in groups and not has_hidden:
                continue
            label = "+".join(groups)
            pred, _ = select_predictor(wl, groups, name=label, kinds=(predictor.kind,))
            predictors[f"predicted[{label}]"] = pred
    prediction = {"calibrated-confidence": _prediction(conf_only, wl, split)}
    # the prediction figures of the model that predicts on this workload (the fallback where it lacks a signal)
    prediction.update({name: _prediction(active if p is predictor else p, wl, split) for name, p in predictors.items()})
    controllers: list[Any] = [("marginal", MarginalStop())]
    controllers += [(name, PredictedMarginal(p, name=name)) for name, p in predictors.items()]
    if predictor.continuation:  # optimal stopping on the same predictions
        name = f"planned:{predictor.name}"
        controllers.append((name, PlannedStop(predictor, name=name)))
    controllers += list(extra_controllers)
    rep = evaluate(EvalConfig(workload=wl, controllers=controllers, split=split, profile=profile,
                              bootstrap=0, per_request=True))
    times = {k: np.asarray(v) for k, v in rep["per_request_time_ms"].items()}
    best_fixed = f"fixed:{rep['reference']['best_fixed_k']}"
    requests = wl.split_indices(split)
    loops = np.array([request_loops(wl, int(r)) for r in requests])
    tokens = wl.lengths[requests].astype(np.float64)
    names = [n for n in rep["controllers"] if n != "marginal"]
    speed = {label: _speed(times, names, best_fixed, mask, bootstrap, tokens)
             for label, mask in (("all", np.ones(len(requests), bool)), ("loops", loops), ("no_loops", ~loops))}
    return {"workload": wl.name, "synthetic": wl.is_synthetic, "split": split, "requests": int(len(requests)),
            "loop_share": float(loops.mean()) if len(loops) else float("nan"),
            "profile": rep["profile"]["name"], "predictor": predictor.name, "kind": predictor.kind,
            "groups": list(predictor.groups), "prediction": prediction, "speed": speed,
            "notes": [f"predicted:{predictor.name}: {note}"] if note else [],
            "bootstrap": {"resamples": bootstrap, "level": 0.95, "unit": "request"}}


def report_markdown(r: dict[str, Any]) -> str:
    """The report as Markdown tables (prediction, then speed overall / loops / no loops)."""
    lines = [f"# Acceptance predictor {r['predictor']} ({r['kind']}, groups {'+'.join(r['groups'])})", "",
             f"Workload {r['workload']}{' (SYNTHETIC)' if r['synthetic'] else ''}, split {r['split']} "
             f"({r['requests']} requests, loop share {r['loop_share']:.2f}), profile {r['profile']}.", "",
             "## Prediction", "", "| predictor | AUC | log loss | ECE | AUC (loops) | AUC (no loops) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, m in r["prediction"].items():
        a = m["all"]
        lo = m.get("loops") or {}
        nl = m.get("no_loops") or {}
        lines.append(f"| {name} | {a['auc']:.3f} | {a['log_loss']:.3f} | {a['ece']:.3f} | "
                     f"{lo.get('auc', float('nan')):.3f} | {nl.get('auc', float('nan')):.3f} |")
    if r.get("notes"):
        lines += ["", "## Notes", "", *(f"- {note}" for note in r["notes"])]
    for label, s in r["speed"].items():
        if not s.get("requests"):
            continue
        lines += ["", f"## Speed: {label.replace('_', ' ')} ({s['requests']} requests; best fixed {s['best_fixed']})",
                  "", "| controller | tok/s | vs marginal [95% CI] | vs best fixed K [95% CI] | headroom closed "
                  "(clairvoyant / informed) |", "|---|---:|---:|---:|---:|"]
        for name, row in s["controllers"].items():
            if "vs_marginal" not in row:
                lines.append(f"| {name} | {row['tok_s']:.1f} | | | |")
                continue
            cells = []
            for key in ("vs_marginal", "vs_best_fixed"):
                ci = row[key]["ci95"]
                cells.append(f"{row[key]['ratio']:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
            lines.append(f"| {name} | {row['tok_s']:.1f} | {cells[0]} | {cells[1]} | "
                         f"{100 * row['headroom_closed']:.0f}% / {100 * row['headroom_closed_informed']:.0f}% |")
    return "\n".join(lines) + "\n"
