"""Tree controller specs (names start with ``tree``), the tree counterpart of :mod:`specgym.agents.registry`.

Grammar: ``tree-static:W1-W2-..`` (a fixed shape of per-depth widths), ``tree-sequoia[:BUDGET]`` (Sequoia's
static tree fitted on the train split, at most BUDGET nodes), ``tree-eagle[:DEPTH:BEAM:M]`` (EAGLE-2's dynamic
tree, approximate in replay), ``tree-chain:SPEC`` (any chain controller as width-1 trees).
``tree-predicted:NAME`` (the dynamic spine tree over an acceptance predictor,
:mod:`specgym.baselines.tree_predicted`), ``tree-ppo:PATH`` (an exported tree-mode PPO policy).
``tree-oracle`` (the clairvoyant limit) is a row of the evaluation, not a controller.
:data:`TREE_ALL` joins ``all`` when the workload can be tree-replayed (greedy, with ranks).
"""

from __future__ import annotations

from specgym.agents.artifact import load_policy
from specgym.agents.registry import make_controller
from specgym.agents.tree_policy import TreePolicyController
from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_predicted import PredictedTree
from specgym.baselines.tree_static import SequoiaTree, StaticTree
import specgym.catalogue as catalogue
from specgym.envs.core.acceptance_predictor import load_predictor
from specgym.envs.core.cost import TREE_NODE_LIMIT
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.tree import TreeController, TreeShape
from specgym.errors import SpecgymError

TREE_ORACLE = "tree-oracle"
TREE_ALL = ("tree-sequoia", "tree-eagle", "tree-static:2-2-1", TREE_ORACLE)
_USAGE = ("tree-static:W1-W2-.., tree-sequoia[:BUDGET], tree-eagle[:DEPTH:BEAM:M], tree-chain:SPEC (a chain "
          "controller as width-1 trees), tree-predicted:NAME|FILE, tree-ppo:PATH|NAME, tree-oracle")


def is_tree_spec(spec: str) -> bool:
    """True for a tree controller spec (its name starts with ``tree``)."""
    return spec.strip().lower().startswith("tree")


def _ints(arg: str, sep: str, spec: str) -> list[int]:
    try:
        return [int(x) for x in arg.split(sep)]
    except ValueError:
        raise SpecgymError(f"bad tree spec {spec!r}: integers expected; valid: {_USAGE}") from None


def make_tree_controller(spec: str, k_max: int = DEFAULT_K_MAX) -> TreeController:
    """Build the tree controller a spec names; a bad spec raises one line listing the valid forms."""
    name, sep, arg = spec.strip().lower().partition(":")
    if name == "tree-static" and arg:
        tree = TreeShape.from_widths(_ints(arg, "-", spec))
        if tree.depth > k_max:
            raise SpecgymError(f"bad tree spec {spec!r}: depth {tree.depth} above k_max {k_max}")
        return StaticTree(tree)
    if name == "tree-sequoia":
        budget = _ints(arg, ":", spec)[0] if sep else TREE_NODE_LIMIT
        if not 1 <= budget <= TREE_NODE_LIMIT:
            raise SpecgymError(f"bad tree spec {spec!r}: BUDGET must be in 1..{TREE_NODE_LIMIT}")
        return SequoiaTree(budget, k_max)
    if name == "tree-chain" and arg:
        return ChainAsTree(make_controller(spec.strip().partition(":")[2], k_max))
    if name == "tree-predicted":
        if not arg:
            raise SpecgymError(f"bad tree spec {spec!r}: tree-predicted needs a predictor, e.g. tree-predicted:midpair")
        raw = spec.strip().partition(":")[2]
        return PredictedTree(load_predictor(catalogue.resolve("predictor", raw)), f"tree-predicted:{raw}", k_max)
    if name == "tree-ppo" and arg:
        raw = spec.strip().partition(":")[2]
        return TreePolicyController(load_policy(catalogue.resolve("policy", raw), expect_mode="tree"),
                                    f"tree-ppo:{raw}")
    if name == "tree-eagle":
        depth, beam, m = _ints(arg, ":", spec) if sep else (5, 4, 16)
        if depth > k_max or m > TREE_NODE_LIMIT:
            raise SpecgymError(f"bad tree spec {spec!r}: DEPTH <= k_max {k_max}, M <= {TREE_NODE_LIMIT}")
        return EagleTree(depth, beam, m)
    raise SpecgymError(f"bad tree spec {spec!r}; valid: {_USAGE}")
