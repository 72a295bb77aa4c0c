"""The policy modes: one row per kind of learned decision, with everything that differs between them.

A mode (``k``, ``token``, ``tree``, ``batch``) is what ``specgym train --mode`` trains and what an exported policy's
``policy.json`` names. Its :class:`PolicyMode` row holds both faces of it:

* **deployment**: the decision kind (the runner that plays it, :mod:`specgym.agents.specs`), the spec prefix that
  names its exported policies, the features it observes at each feature version, the action mapping and action
  count, and the controller class that runs an artifact;
* **training**: the Gymnasium env id it trains on (Gymnasium's own registry resolves it, as for every env), the
  RL-Zoo-style config file of its hyperparameters, whether K-mode's ``SB3ActionWrapper`` and token shaping apply,
  the baselines its validation compares against and the figure the best model is kept by, and the words its
  summary and policy card use.

Every ``mode ==`` question of the artifact, the export, the env factory, validation, behaviour cloning, the summary
and the policy card is a look-up here. A new mode is one row (and its env, controller and features; an
action type of its own is one row of :data:`ACTIONS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specgym.agents.alloc_policy import ALLOC_FEATURE_NAMES, ALLOC_GAMMAS, AllocPolicyController
from specgym.agents.batch_policy import BatchPolicyController
from specgym.agents.drafter_policy import DrafterPolicyController
from specgym.agents.policy_controller import PolicyController
from specgym.agents.tree_policy import TreePolicyController
from specgym.envs.core.batch import BATCH_FEATURE_NAMES
from specgym.envs.core.drafter_features import DRAFTER_FEATURE_VERSION, DRAFTER_FEATURE_VERSIONS, drafter_feature_names
from specgym.envs.core.drafter_features import SLOTS as DRAFTER_SLOTS
from specgym.envs.core.drafter_features import n_actions as drafter_actions
from specgym.envs.core.features import FEATURE_VERSION, SUPPORTED_FEATURE_VERSIONS, feature_names
from specgym.envs.core.kinds import TOKEN_LEVEL_MODES, KindName, ModeName
from specgym.errors import SpecgymError

#: Feature version of batch-mode policies (their features are :data:`BATCH_FEATURE_NAMES`).
BATCH_FEATURE_VERSION = 1
#: Feature version of alloc-mode policies (:data:`~specgym.agents.alloc_policy.ALLOC_FEATURE_NAMES`).
ALLOC_FEATURE_VERSION = 1


@dataclass(frozen=True)
class PolicyMode:
    """One mode of learned decision.

    Attributes:
        name: ``k``, ``token``, ``tree``, ``batch``, ``drafter`` or ``alloc``.
        kind: The decision kind of its controllers (``chain``, ``tree``, ``batch``, ``drafter``).
        spec_prefix: The spec prefix of its exported policies (``ppo``, ``tree-ppo``).
        features: ``features(version)`` -> the ordered feature names a policy of this mode observes.
        feature_version: The feature version policies are trained with now.
        feature_versions: Feature versions an exported policy may carry and still run.
        action: The action mapping type recorded in ``policy.json``.
        controller: ``controller(artifact, name, k_max)`` -> the controller that runs an artifact.
        env_id: The Gymnasium id it trains on.
        config: Its hyperparameter file in ``training/configs/``.
        token_level: Its decisions are per draft token (the policy stops drafting; token shaping applies).
        draft_view: It may read an acceptance predictor through the serving engine's draft view (embedded in the
            exported policy).
        predictor: It may be trained with an acceptance predictor (``--hyperparams predictor=NAME``).
        guarded: Its export records the observation range seen in training, and a guard hands decisions outside
            it to a teacher rule (``specgym policy-guard``).
        teacher: The rule its guard hands those decisions to (None: a chain policy's, ``marginal``, or ``planned``
            for a policy that reads a continuation predictor).
        env_demonstrations: Behaviour cloning records its teacher in its own training env (the budget rule the
            alloc policy calibrates) instead of replaying the teacher controller over the workload.
        k_actions: Its action index is a draft cap ``k_min + a`` (SB3 needs ``SB3ActionWrapper``'s ``start=0``).
        compared: The baselines training validation compares it with.
        best_key: The validation figure its best model is kept by.
        reference: How its summary names the fixed reference (``the best fixed K``).
        decides: What the policy card says it decides.
    """

    name: ModeName
    kind: KindName
    spec_prefix: str
    features: Callable[[int], list[str]]
    feature_version: int
    feature_versions: tuple[int, ...]
    action: str
    controller: Callable[[Any, str, int], Any]
    env_id: str
    config: str
    k_actions: bool = False
    env_demonstrations: bool = False
    draft_view: bool = False
    predictor: bool = False
    guarded: bool = False
    teacher: str | None = None
    compared: tuple[str, ...] = ()
    best_key: str = "speedup_vs_best_fixed"
    reference: str = "the best fixed K"
    decides: str = ""

    @property
    def token_level(self) -> bool:
        """Its decisions are per draft token (:data:`~specgym.envs.core.kinds.TOKEN_LEVEL_MODES`)."""
        return self.name in TOKEN_LEVEL_MODES

    def n_actions(self, k_min: int, k_max: int, shapes: list[list[int] | str] | None = None) -> int:
        """Size of the action layer of a policy of this mode (its :data:`ACTIONS` row)."""
        return ACTIONS[self.action].count(k_min, k_max, shapes)

    def action_mapping(self, k_min: int, n_actions: int, shapes: list[list[int] | str] | None = None) -> dict[str, Any]:
        """How an action index maps to a decision (recorded in ``policy.json``)."""
        return {"type": self.action, "values": ACTIONS[self.action].values(k_min, n_actions, shapes)}


@dataclass(frozen=True)
class ActionSpace:
    """What a policy's action index means, one row per ``action`` type a mode names (:data:`ACTIONS`).

    Attributes:
        count: ``count(k_min, k_max, shapes)`` -> the size of the action layer.
        values: ``values(k_min, n_actions, shapes)`` -> the decision of each action index (``policy.json``'s
            ``action.values``).
    """

    count: Callable[[int, int, list[list[int] | str] | None], int]
    values: Callable[[int, int, list[list[int] | str] | None], list[Any]]


def _drafter_cap_values(k_min: int, n_actions: int, shapes: list[list[int] | str] | None) -> list[Any]:
    """0: plain; then slot s (the engine's drafters in order, :data:`DRAFTER_SLOTS` of them) with K = 1..k_max."""
    k_max = (n_actions - 1) // DRAFTER_SLOTS
    return ["plain", *(f"slot{s}:{k}" for s in range(DRAFTER_SLOTS) for k in range(1, k_max + 1))]


#: The action types of the modes: a draft cap ``k_min + a``, a stop or continue per draft token, a menu of tree
#: shapes, a drafter slot and cap, a budget calibration.
ACTIONS: dict[str, ActionSpace] = {
    "draft_cap": ActionSpace(lambda k_min, k_max, shapes: k_max - k_min + 1,
                             lambda k_min, n, shapes: list(range(k_min, k_min + n))),
    "stop_or_continue": ActionSpace(lambda k_min, k_max, shapes: 2, lambda k_min, n, shapes: ["stop", "continue"]),
    "tree_widths": ActionSpace(lambda k_min, k_max, shapes: len(shapes or []),
                               lambda k_min, n, shapes: [s if isinstance(s, str) else [int(w) for w in s]
                                                         for s in shapes or []]),
    "drafter_cap": ActionSpace(lambda k_min, k_max, shapes: drafter_actions(k_max), _drafter_cap_values),
    "budget_gamma": ActionSpace(lambda k_min, k_max, shapes: len(ALLOC_GAMMAS),
                                lambda k_min, n, shapes: list(ALLOC_GAMMAS)),
}


def _chain_features(mode: str) -> Callable[[int], list[str]]:
    return lambda version: feature_names(mode, version)


def _chain(artifact: Any, name: str, k_max: int) -> PolicyController:
    ctrl = PolicyController(artifact, name)
    ctrl.check_engine_k_max(k_max)
    return ctrl


MODES: dict[str, PolicyMode] = {m.name: m for m in (
    PolicyMode("k", "chain", "ppo", _chain_features("k"), FEATURE_VERSION, SUPPORTED_FEATURE_VERSIONS, "draft_cap",
               _chain, "specgym/SpecDecode-v1", "k.yaml", k_actions=True, guarded=True, compared=("speclane",),
               decides="it chooses the draft cap K of each round."),
    PolicyMode("token", "chain", "ppo", _chain_features("token"), FEATURE_VERSION, SUPPORTED_FEATURE_VERSIONS,
               "stop_or_continue", _chain, "specgym/SpecDecodeToken-v1", "token.yaml",
               predictor=True, guarded=True, compared=("speclane", "confidence:0.4"),
               decides="it decides after each draft token whether to keep drafting (and at the start of a round "
                       "whether to draft at all)."),
    PolicyMode("tree", "tree", "tree-ppo", _chain_features("k"), FEATURE_VERSION, SUPPORTED_FEATURE_VERSIONS,
               "tree_widths", lambda art, name, k_max: TreePolicyController(art, name), "specgym/SpecDecodeTree-v0",
               "tree.yaml", compared=("tree-sequoia",),
               decides="it chooses the draft tree of each round from its menu of static shapes (per-depth widths)."),
    PolicyMode("batch", "batch", "ppo", lambda version: list(BATCH_FEATURE_NAMES), BATCH_FEATURE_VERSION,
               (BATCH_FEATURE_VERSION,), "draft_cap", lambda art, name, k_max: BatchPolicyController(art, name),
               "specgym/SpecDecodeBatch-v0", "batch.yaml", compared=("goodput",), best_key="speedup_vs_goodput",
               guarded=True, teacher="goodput", reference="the best static K",
               decides="it chooses the draft length of each serving step."),
    PolicyMode("drafter", "drafter", "ppo", drafter_feature_names, DRAFTER_FEATURE_VERSION,
               DRAFTER_FEATURE_VERSIONS, "drafter_cap",
               lambda art, name, k_max: DrafterPolicyController(art, name), "specgym/SpecDecodeDrafter-v0",
               "drafter.yaml", compared=("lookup-rule:3", "drafter-marginal"), guarded=True,
               teacher="drafter-marginal",
               decides="it chooses the drafter (of the engine's first three, or none) and the draft cap of each "
                       "round."),
    PolicyMode("alloc", "batch", "alloc-ppo", lambda version: list(ALLOC_FEATURE_NAMES), ALLOC_FEATURE_VERSION,
               (ALLOC_FEATURE_VERSION,), "budget_gamma", lambda art, name, k_max: AllocPolicyController(art, name),
               "specgym/SpecDecodeAlloc-v0", "alloc.yaml", draft_view=True, predictor=True, env_demonstrations=True,
               compared=("budget:logistic",),
               best_key="speedup_vs_budget", reference="the best static K",
               decides="it sets each serving step's verification budget (the calibration of the budget rule's "
                       "survivals); the budget rule splits it across requests and cuts their drafts."),
)}

#: The modes a :class:`~specgym.agents.policy_controller.PolicyController` runs (a draft cap per round, or a stop per
#: draft token).
ROUND_POLICY_MODES: tuple[str, ...] = tuple(name for name, m in MODES.items() if m.controller is _chain)


def get_mode(name: str) -> PolicyMode:
    """The row of mode ``name``; an unknown one is a one-line error listing the modes."""
    mode = MODES.get(name)
    if mode is None:
        raise SpecgymError(f"policy mode must be one of {tuple(MODES)}, got {name!r}")
    return mode
