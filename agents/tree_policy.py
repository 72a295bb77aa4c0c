"""The deployed tree-mode PPO policy (``tree-ppo:PATH``): a numpy-only tree controller over an exported artifact.

A tree-mode artifact (``specgym train --mode tree``, ``specgym export``; :mod:`specgym.agents.artifact`
documents the files, checksums and feature-version check) maps the observation of ``specgym/SpecDecodeTree-v0`` to
an index into its action menu (``policy.json``'s ``action_mapping``, type ``tree_widths``: per-depth widths of a
static tree, or an EAGLE-2 round ``eagle:D:B:M`` on a head policy, :mod:`~specgym.baselines.tree_menu`).
The observation is the shared :class:`~specgym.envs.core.features.FeatureTracker`'s K-mode vector, fed each verified
tree round as the chain round along its true path (:meth:`TreeReplayRequest.as_round`), exactly as the env feeds
it, so the controller sees in deployment what the policy saw in training. It emits :class:`TreeShape` trees, the
action type of the static tree baselines, so a live tree engine drives it through ``propose_tree`` /
:meth:`TreePolicyController.observe_round`.

A policy trained on trees drafted by the draft head (artifact ``drafter: head``, ``specgym train --mode tree
--hyperparams drafter=head``) drafts with the head (its ``drafter``; a spec naming another drafter is refused) and,
in replay as live, observes its rounds priced as the head's and without the spine's per-token features
(:func:`~specgym.envs.core.tree.head_tree_context`, :meth:`TreeReplayRequest.as_round_unsignalled`): the recording
holds none of the head's, so neither did its training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from specgym.agents.policy_controller import PolicyNetwork
from specgym.baselines.tree_menu import menu
from specgym.envs.core.features import FeatureTracker
from specgym.envs.core.rounds import RequestContext, RoundOutcome
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape, head_tree_context
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact


class TreePolicyController(TreeController):
    """Runs a tree-mode policy artifact as a :class:`TreeController`.

    Args:
        artifact: A loaded tree-mode policy (:func:`~specgym.agents.artifact.load_policy`).
        name: Display name (starts with ``tree``).
    """

    def __init__(self, artifact: PolicyArtifact, name: str = "tree-ppo"):
        artifact.validate()
        artifact.require(("tree",), "tree-ppo")
        self.artifact = artifact
        self.name = name
        self.k_max = artifact.k_max
        self.network = PolicyNetwork(artifact)
        self.menu = menu(artifact.shapes, self.k_max, f"{name}: action menu")
        self.approximate = any(e.approximate for e in self.menu)
        self.tracker = FeatureTracker(self.k_max)

    @property  # type: ignore[override]
    def drafter(self) -> str | None:
        """Who drafts its trees: the drafter it was trained on (the artifact's)."""
        return self.artifact.drafter

    @drafter.setter
    def drafter(self, value: str | None) -> None:
        if value != self.artifact.drafter:
            trained = f"the {self.artifact.drafter}" if self.artifact.drafter else "the draft model"
            raise SpecgymError(f"{self.name}: trained on trees drafted by {trained}; it cannot draft with "
                               f"{value or 'the draft model'} (its observations would differ from training)")

    def reset(self, ctx: RequestContext) -> None:
        """Start a request: clear the feature history (the engine must allow the policy's deepest tree)."""
        if ctx.k_max < self.k_max:
            raise SpecgymError(f"policy {self.name} was trained with k_max={self.k_max}, the engine allows only "
                               f"{ctx.k_max} (pass --k-max {self.k_max})")
        self.ctx = ctx if self.drafter is None else head_tree_context(ctx)
        self.tracker.reset(self.ctx)

    def action(self) -> int:
        """The policy's action index for the current observation."""
        return self.network.act(self.tracker.observation())

    def propose_tree(self) -> TreeShape:
        """The tree of the next round (a static entry; an EAGLE-2 entry's tree comes from the round itself)."""
        entry = self.menu[self.action()]
        if entry.shape is None:
            raise SpecgymError(f"{self.name}: its action is {entry.label}, a tree chosen from the round's draft "
                               "probabilities: call play(req) or play_live(req)")
        return entry.shape

    def observe_round(self, rnd: RoundOutcome) -> None:
        """Fold a verified tree round, given as the chain round along its true path, into the features."""
        self.tracker.update(rnd)

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round (:class:`TreeReplayRequest`): propose, play, observe the true-path round (a head
        tree's without its spine features)."""
        o = self.menu[self.action()].play(req)
        self.observe_round(req.as_round(o) if self.drafter is None else req.as_round_unsignalled(o))
        return o

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round: propose, play, observe the round as the chain round along the draft's rank-0 spine (what
        a live chain round reports: the draft's own top-1 tokens, their confidence and entropy; for head trees
        none, as in training)."""
        head = self.drafter is not None
        o = self.menu[self.action()].play_live(req, stats=not head)
        conf, ent = (np.full(o.depth, np.nan, np.float32),) * 2 if head else (req.spine_conf, req.spine_entropy)
        self.observe_round(RoundOutcome(o.position, o.depth, o.depth, o.accepted, o.produced, o.time_ms,
                                        conf, ent, done=o.done))
        return o
