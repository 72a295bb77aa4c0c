"""``specgym/SpecDecodeTree-v0``: choose the draft tree of each round, over exact greedy tree replay."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from specgym.baselines.tree_menu import menu
from specgym.envs.core.features import FeatureTracker, feature_table
from specgym.envs.engines.replay.tree_engine import TreeEngine, TreeReplayRequest
from specgym.envs.gym.spec_env import _ReplayEnvBase
from specgym.errors import SpecgymError

#: The default action menu: plain decoding, the chains K = 1..8, and static trees (per-depth widths).
DEFAULT_SHAPES: tuple[tuple[int, ...], ...] = (
    (), (1,), (1, 1), (1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 1, 1),
    (1, 1, 1, 1, 1, 1, 1, 1), (2,), (2, 1), (2, 1, 1), (2, 2, 1), (2, 1, 1, 1), (2, 2, 1, 1), (3, 1, 1),
    (3, 2, 1, 1), (2, 2, 2, 1, 1), (4, 2, 1, 1, 1), (2, 1, 1, 1, 1, 1),
)


class SpecDecodeTreeEnv(_ReplayEnvBase):
    """Choose the draft tree of each speculative-decoding round.

    ## Description
    The draft proposes a tree of continuations (every node at depth ``d`` expands its top-``w_d`` tokens), the
    target verifies all nodes in one forward with tree attention, and the round produces the deepest true-path node
    in the tree plus one token of the target's own. The environment replays a **greedy** trace with ranks (trace
    format v2) exactly (:mod:`specgym.envs.engines.replay.tree_engine`); v1 and sampled traces are refused. One episode
    is
    one request.

    ## Action Space
    ``Discrete(len(shapes))``: an index into a menu of static shapes (config ``shapes``; default: plain decoding,
    the chains K = 1..8 and eleven trees up to 34 nodes, :data:`DEFAULT_SHAPES`). Why a menu and not LTD's pair
    (depth, verified nodes): which nodes a (depth, budget) pair verifies needs a rule that scores off-path nodes
    (EAGLE-2's confidences), which the trace does not hold, so that pair could only be replayed approximately;
    every width shape replays exactly. A menu is also a plain ``Discrete`` space (PPO-ready), holds the chain env's
    actions (so a tree policy can never do worse than a chain one) and lets the user add shapes. With
    ``drafter="head"`` a menu may also hold EAGLE-2 rounds (``"eagle:D:B:M"``, :mod:`~specgym.baselines.tree_menu`:
    LTD's per-round depth and verify budget over EAGLE's expansion), replayed as approximately as the rule is.

    ## Observation Space
    The K-mode observation of :class:`~specgym.envs.gym.spec_env.SpecDecodeEnv` (the shared
    :class:`~specgym.envs.core.features.FeatureTracker`, same version), fed with each tree round as a chain round
    of ``drafted = depth`` along the true path:

    {features}

    ## Rewards
    ``produced - time_ms / t_AR`` per round, as the chain environments (``info["rewards"]`` holds the parts).

    ## Starting State
    Position 0 of a request drawn uniformly from the configured split, or ``reset(options={{"request": ...}})``.

    ## Episode End
    Terminates when the completion is fully produced; never truncated.

    ## Arguments
    ``gymnasium.make("specgym/SpecDecodeTree-v0", **config)``: the chain env's keys plus ``shapes`` (tuple of
    width tuples), ``node_budget`` (at most 64) and ``drafter`` (``None``: trees drafted by the draft model;
    ``"head"``: by the pair's draft head, replayed from the recording's ``ranks_head``, priced as the head, and
    observed without the spine's per-token features, which the recording does not hold: the policy then sees the
    same live, :class:`~specgym.agents.tree_policy.TreePolicyController`). ``k_max`` is the deepest tree; the
    profile prices verify over up to ``node_budget + 1`` tokens (:meth:`CostProfile.verify_nodes`, linear
    extrapolation beyond the measured list).

    ## Info
    ``shape``, ``depth``, ``nodes``, ``accepted``, ``produced``, ``time_ms``, the reward parts, request, position,
    length, elapsed time and ``t_ar_ms``.

    ## Version History
    * v0: initial release (feature version 3).
    """

    mode = "k"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """The chain env's keys (``k_min`` unused) plus ``shapes``, ``node_budget`` and ``drafter``."""
        return {**super().default_config(), "shapes": DEFAULT_SHAPES, "node_budget": 64, "drafter": None}

    def _build(self) -> None:
        super()._build()
        if self.domains is not None:
            raise SpecgymError("SpecDecodeTree-v0 does not support domains (tree replay needs one greedy v2 trace)")
        self.tree_engine = TreeEngine(self.workload, self.engine.profile, self.k_max, int(self.config["node_budget"]),
                                      drafter=self.config["drafter"])
        self.menu = menu(self.config["shapes"], self.k_max, "SpecDecodeTree-v0 config shapes")
        for e in self.menu:
            if e.shape is not None:
                self.tree_engine.check(e.shape)
                self.tree_engine.times(e.shape)
            elif self.tree_engine.drafter is None:
                raise SpecgymError(f"SpecDecodeTree-v0 config shapes: {e.label} needs drafter 'head' (a policy on the "
                                   "draft model's trees observes its spine features, which an EAGLE-2 round reports "
                                   "none of)")
            elif e.eagle is not None and (e.depth > self.tree_engine.max_depth or
                                          min(e.eagle[2], e.eagle[1] * e.depth) > self.tree_engine.node_budget):
                raise SpecgymError(f"SpecDecodeTree-v0 config shapes: {e.label} exceeds depth "
                                   f"{self.tree_engine.max_depth} / node_budget {self.tree_engine.node_budget}")
        self.shapes = [e.shape for e in self.menu]
        self.action_space = spaces.Discrete(len(self.menu))
        self.tracker = FeatureTracker(self.k_max)
        self.treq: TreeReplayRequest | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new request; returns ``(observation, info)``."""
        self._start(seed, options)
        self.treq = self.tree_engine.start(self.request_index)
        self.tracker.reset(self.treq.context)  # head trees: without the spine's per-token features
        return self.tracker.observation(), self._base_info()

    def step(self, action):
        """Play one round with the tree ``shapes[action]``; returns the Gymnasium 5-tuple."""
        treq = self.treq
        self._check_running(treq is not None and not treq.done)
        assert treq is not None
        entry = self.menu[self._check_action(action)]
        o = entry.play(treq)
        rnd = treq.as_round(o) if self.tree_engine.drafter is None else treq.as_round_unsignalled(o)
        info = self._round_info(rnd)
        info["shape"], info["depth"], info["nodes"] = entry.label, o.depth, o.nodes
        assert self.req is not None
        self.req.position, self.req.done = treq.position, treq.done
        info.update(self._base_info())
        return self.tracker.observation(), self._reward(rnd), o.done, False, info


SpecDecodeTreeEnv.__doc__ = (SpecDecodeTreeEnv.__doc__ or "").format(
    features=feature_table("k").replace("\n", "\n    "))
