"""``python -m specgym.commands.policy_card``: ship the best seed of a policy's runs with its card
(:mod:`specgym.training.policy_card`; run by ``make policies*``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specgym.commands.args import path_type
from specgym.errors import SpecgymError
from specgym.training.policy_card import best_run, ship_policy, write_policy_card


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m specgym.commands.policy_card",
                                description=__doc__.split("\n")[0])
    p.add_argument("policy", type=path_type, help="the exported policy folder (data/policies/NAME)")
    p.add_argument("--runs", required=True, help="comma-separated run folders of every seed")
    p.add_argument("--suite", type=path_type, default=None, help="suite.json of specgym eval --suite generalization")
    p.add_argument("--suite-specs", default="", help="the suite's spec of each run, same order as --runs")
    p.add_argument("--reproduce", default="make policies", help="the command that rebuilds it (shown in the card)")
    p.add_argument("--card-only", action="store_true", help="only rewrite the card of the policy already there")
    p.add_argument("--force", action="store_true", help="replace an existing policy folder")
    a = p.parse_args(argv)
    try:
        runs = [Path(r) for r in a.runs.split(",") if r]
        specs = [s for s in a.suite_specs.split(",") if s] or None
        if specs and len(specs) != len(runs):
            raise SpecgymError("--suite-specs needs one spec per run")
        shipped = best_run(runs)
        if not a.card_only:
            ship_policy(shipped, a.policy, a.force)
        card = write_policy_card(a.policy, runs, shipped, a.suite, specs, a.reproduce)
        print(f"shipped {shipped} -> {card}")
    except SpecgymError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
