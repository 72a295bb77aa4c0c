"""``python -m specgym.commands.policy_guard``: give an exported policy trained before feature ranges were recorded
its guard (the range of the observations it meets on its training requests, and its teacher).

A policy exported by ``specgym export`` now carries the range it saw in training
(:mod:`specgym.training.feature_ranges`). For an older artifact the range is measured afterwards: the policy itself
decides on ``--passes`` replays of its training workload's train split with fresh outcome draws (or, with
``--domains generalist``, on ``--episodes`` episodes of the generalist training distribution), and the range of
those observations becomes its guard, recorded in ``policy.json`` as measured this way. The weights are untouched;
the files are rewritten under new checksums and the folder's other files (the card) are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from specgym.agents.artifact import load_policy, rewrite_artifact
from specgym.commands.args import path_type
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.workloads.domains import generalist_domains
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.training.feature_ranges import observed_range


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m specgym.commands.policy_guard", description=__doc__.split("\n")[0])
    p.add_argument("policy", type=path_type, help="the exported policy folder (data/policies/NAME)")
    p.add_argument("--workload", default=None, help="its training workload (default: the one policy.json names)")
    p.add_argument("--domains", choices=("generalist",), default=None,
                   help="its training distribution instead of one workload")
    p.add_argument("--passes", type=int, default=2, help="replays of the train split (default %(default)s)")
    p.add_argument("--episodes", type=int, default=3000, help="episodes of --domains (default %(default)s)")
    a = p.parse_args(argv)
    try:
        art = load_policy(a.policy)
        art.require(("k", "token"), f"the guard (of {a.policy})")
        if a.domains:
            source: object = generalist_domains()
            what = f"{a.episodes} episodes of the generalist training distribution"
        else:
            name = a.workload or (art.meta.get("training") or {}).get("workload")
            if not name:
                raise SpecgymError(f"{a.policy}: policy.json names no training workload: pass --workload")
            source = cached_workload(name)
            what = f"{a.passes} replays of {name}'s {source.fit_split} split (fresh outcome draws each)"
        low, high = observed_range(art, source, passes=a.passes, episodes=a.episodes)
        pred = None if art.predictor is None else AcceptancePredictor.from_dict(art.predictor)
        teacher = "planned" if pred is not None and pred.continuation else "marginal"
        meta = {**art.meta, "guard_range": f"measured after training: the observations the policy decides on over "
                                           f"{what} (python -m specgym.commands.policy_guard)"}
        rewrite_artifact(dataclasses.replace(art, obs_low=low, obs_high=high, teacher=teacher, meta=meta), a.policy)
        print(f"{a.policy}: guard from {what}; teacher {teacher}")
    except SpecgymError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
