"""The actor of a stable-baselines3 ``MlpPolicy``: ``mlp_extractor.policy_net`` then ``action_net``.

The one place that knows where SB3 keeps it: export reads its layers, behaviour cloning fits it, and the critic
warm-up callback freezes it.
"""

from __future__ import annotations

from typing import Any


def actor_parameters(model: Any) -> list[Any]:
    """The actor's parameters (policy net, then action head), without the critic's."""
    pol = model.policy
    return list(pol.mlp_extractor.policy_net.parameters()) + list(pol.action_net.parameters())


def actor_logits(model: Any, obs: Any) -> Any:
    """Action logits of a batch of (normalised) observations, a torch tensor."""
    pol = model.policy
    return pol.action_net(pol.mlp_extractor.forward_actor(obs))


def actor_layers(model: Any) -> tuple[list[Any], set[str]]:
    """``(linear layers in order, the action head last; names of the activation modules between them)``."""
    import torch.nn as nn

    net = model.policy.mlp_extractor.policy_net
    layers = [m for m in net if isinstance(m, nn.Linear)]
    acts = {type(m).__name__ for m in net if not isinstance(m, nn.Linear)}
    return [*layers, model.policy.action_net], acts
