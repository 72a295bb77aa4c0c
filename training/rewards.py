"""Training-time reward wrappers: the same optimum as the environment's reward, easier credit assignment.

The environment's reward is ``produced - time / t_AR`` (a token is worth one plain step). PPO's value function
cannot see how many tokens remain in a request (the features exclude the completion length on purpose), so credit
is assigned almost myopically; with a token worth a full ``t_AR`` the myopic optimum overvalues tokens (a token
really saves ``T / N`` time, not ``t_AR``) and drafts too long. :class:`TokenValueReward` scales the token part
(``token_value * produced - time / t_AR``); for a request of ``N`` tokens the return is ``token_value * N - T/t_AR``
and ``N`` is fixed by the request, so the optimal policy is unchanged. ``auto`` sets ``token_value = 1 / speedup``
of the best fixed K on the training split (the time a token costs at a good rate; the Dinkelbach-style fix for a
ratio objective). :class:`TokenShaping` adds return-preserving shaping in token mode.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym

from specgym.envs.core.economics import RoundCosts
from specgym.envs.core.features import feature_names
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay


class TokenValueReward(gym.Wrapper):
    """Reward ``token_value * produced - time/t_AR`` instead of the env's ``produced - time/t_AR``.

    Tokens produced in a step are read from ``info["position"]`` (the request position after the step), so rounds
    the token env plays automatically are counted too. ``token_value = 1`` is the identity; ``None`` sets it per
    episode to :func:`episode_token_value` of the episode's workload and profile (domain randomisation).
    """

    def __init__(self, env: gym.Env, token_value: float | None):
        super().__init__(env)
        self.fixed = token_value
        self.token_value = 1.0 if token_value is None else float(token_value)
        self._pos = 0

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        if self.fixed is None:
            base: Any = self.env.unwrapped
            self.token_value = episode_token_value(base.workload, base.engine.profile, base.k_max)
        self._pos = int(info.get("position", 0))
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        pos = int(info["position"])
        reward = float(reward) - (1.0 - self.token_value) * (pos - self._pos)
        self._pos = pos
        return obs, reward, terminated, truncated, info


class TokenShaping(gym.Wrapper):
    """Token mode only: reward shaping that leaves every episode's return (and so the optimal policy) unchanged.

    * ``draft_cost``: charge ``draft_ms / t_AR`` on the step that drafts a token instead of at verification
      (the verification step gets the charged amount back), so the cost of continuing is immediate.
    * ``conf_potential``: potential-based shaping (Ng, Harada & Russell 1999) with ``Phi = token_value * sum over
      this round's drafted tokens of the running product of draft confidences`` (``token_value`` read from the
      :class:`TokenValueReward` inside this wrapper, so it follows per-episode values)
      (the expected accepted prefix if confidences were calibrated); ``Phi = 0`` at every round start, so the
      shaped return differs from the original by ``-Phi(s_0) = 0`` (exactly for gamma = 1, up to gamma^steps
      factors otherwise). It gives immediate, confidence-aware credit to each continue decision.

    The draft cost is read from the episode's cost profile at every reset (profiles may change per episode).
    Needs the env's ``info["verified"]`` and the ``tok_conf_prod`` observation entry.
    """

    def __init__(self, env: gym.Env, terms: list[str], gamma: float):
        super().__init__(env)
        self.charge = "draft_cost" in terms
        self.potential = "conf_potential" in terms
        self.gamma = float(gamma)
        self.token_value = 1.0
        self._i_prod = feature_names("token").index("tok_conf_prod")
        self._charged = self._phi = self.cost = 0.0

    def reset(self, **kwargs: Any):
        out = self.env.reset(**kwargs)
        base: Any = self.env.unwrapped
        self.cost = base.engine.profile.draft_ms / base.t_ar if self.charge else 0.0
        self.token_value = float(self.env.get_wrapper_attr("token_value"))
        self._charged = self._phi = 0.0
        return out

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        if info.get("verified", True):
            reward += self._charged
            self._charged = 0.0
            phi = 0.0
        else:
            reward -= self.cost
            self._charged += self.cost
            phi = self._phi + self.token_value * float(obs[self._i_prod]) if self.potential else 0.0
        reward += (0.0 if terminated else self.gamma * phi) - self._phi
        self._phi = phi
        return obs, reward, terminated, truncated, info


_MEAN_ACCEPT: dict[int, float] = {}


def episode_token_value(workload: Any, profile: Any, k_max: int) -> float:
    """``1 / speedup`` of the model-optimal fixed K for a workload's mean acceptance under ``profile``: the time a
    token costs at a good rate, computed in microseconds (domain randomisation re-prices every episode)."""
    alpha = _MEAN_ACCEPT.get(id(workload))
    if alpha is None:
        alpha = _MEAN_ACCEPT[id(workload)] = workload.mean_acceptance()
    costs = RoundCosts(profile, k_max)
    return 1.0 / (costs.rate(costs.best_k(alpha), alpha) * costs.t_ar)


def auto_token_value(workload: Any, k_max: int, split: str | None = None,
                     drafter: str | None = None) -> tuple[float, int]:
    """``1 / speedup`` of the best fixed K of ``drafter`` (default: the workload's default drafter) on ``split``
    (default: the rows a policy learns from, :meth:`Workload.learning_requests`: never those a drafter learned from
    or a model is chosen on), and that K: the time a token costs at a good rate."""
    engine = TraceEngine(workload, k_max=k_max, seed=0, drafter=drafter)
    req = workload.learning_requests()[0] if split is None else workload.split_indices(split)
    best_k, best_t = 1, math.inf
    for k in range(1, k_max + 1):
        v = VectorReplay(engine, req)
        v.run_fixed(k)
        if v.time_ms.sum() < best_t:
            best_k, best_t = k, float(v.time_ms.sum())
    tokens = float(workload.lengths[req].sum())
    return best_t / (tokens * engine.t_ar), best_k
