"""Gymnasium environment of batched serving: choose each step's K while many requests are in flight.

Registered by ``import specgym`` as ``specgym/SpecDecodeBatch-v0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from specgym.envs.core.batch import BATCH_FEATURE_DOCS, BATCH_FEATURE_NAMES, BatchFeatureTracker
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX, check_k_max
from specgym.envs.engines.replay.batch_engine import BatchReplay, mixed_schedule
from specgym.envs.gym.config import check_reset_options, int_key, source_key
from specgym.envs.gym.shell import EnvShell
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.errors import SpecgymError
from specgym.paths import default_workload_name


class SpecDecodeBatchEnv(EnvShell):
    """Choose the draft length K of every serving step of a batch of in-flight requests.

    ## Description
    A serving engine runs many requests at once; each step every sequence drafts K tokens and the target verifies
    ``batch x (K + 1)`` tokens in one forward. Past a critical batch size verification is compute-bound and
    speculation slows decoding down, so the right K depends on the batch size, the hardware and the traffic's
    acceptance. One episode serves ``requests`` requests of a workload (closed loop: a finished request is replaced
    at once) under a concurrency schedule that changes over time (``concurrency="mixed"``) or a fixed concurrency.

    ## Action Space
    ``Discrete(k_max + 1)``: the step's K for every sequence (vLLM's form). Out of range raises
    :class:`~specgym.errors.InvalidAction`.

    ## Observation Space
    ``Box`` of float32 (:class:`~specgym.envs.core.batch.BatchFeatureTracker`):

    {features}

    ## Rewards
    ``(produced - time_ms * b / verify(b, 1)) / b``: tokens the step gained over plain decoding at the same batch size
    in the same time, per sequence (0 for plain decoding).

    ## Starting State
    ``requests`` requests drawn without replacement from the split with ``np_random``, the concurrency schedule
    (``"mixed"``: drawn with ``np_random``) and the outcome seed (``outcome_seed``, else drawn).

    ## Episode End
    Terminates when every request of the episode finished; never truncated.

    ## Arguments
    ``workload``, ``batch_profile`` (name, path or object), ``split``, ``requests`` (per episode), ``concurrency``
    (an int, ``[(ms, size), ...]`` or ``"mixed"``), ``max_batch``, ``k_max``, ``outcome_seed``.

    ## Version History
    * v0: initial release.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    config_name = "batch env"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Every configuration key with its default."""
        return {"workload": default_workload_name(), "batch_profile": "batch-a100-7b-roofline", "split": "train",
                "requests": 96, "concurrency": "mixed", "max_batch": 256, "k_max": DEFAULT_K_MAX,
                "outcome_seed": None}

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self._merge_config(config, overrides)
        cfg = self.config
        check_serving_keys(cfg, self.config_name)
        conc = cfg["concurrency"]
        if not (conc == "mixed" or (isinstance(conc, int) and not isinstance(conc, bool) and conc >= 1)
                or (isinstance(conc, (list, tuple)) and conc and all(isinstance(s, (list, tuple)) and len(s) == 2
                                                                    for s in conc))):
            raise SpecgymError(f"batch env config concurrency: expected an integer >= 1, [(ms, size), ...] or "
                               f"'mixed', got {conc!r}")
        self.workload, self.profile, self.k_max, self.pool = open_serving(cfg)
        self.action_space = spaces.Discrete(self.k_max + 1)
        n = len(BATCH_FEATURE_NAMES)
        self.observation_space = spaces.Box(np.zeros(n, np.float32), np.full(n, 2.0, np.float32), dtype=np.float32)
        self.tracker = BatchFeatureTracker(self.k_max)
        self.replay: BatchReplay | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start serving a fresh set of requests; returns ``(observation, info)``."""
        check_reset_options(options, ())
        super().reset(seed=seed)
        cfg = self.config
        rng = self.np_random
        reqs = rng.choice(self.pool, size=min(int(cfg["requests"]), len(self.pool)), replace=False)
        conc = cfg["concurrency"]
        if conc == "mixed":
            conc = mixed_schedule(rng, self.profile, int(cfg["max_batch"]))
        oseed = cfg["outcome_seed"]
        self.replay = BatchReplay(self.workload, self.profile, conc, requests=reqs, k_max=self.k_max,
                                  seed=int(rng.integers(2**31)) if oseed is None else int(oseed))
        self.tracker.reset(self.profile)
        self.state = self.replay.state()
        return self.tracker.observation(self.state), {"batch": self.state.batch}

    def step(self, action: Any):
        """Play one step with K = ``action`` for every sequence."""
        self._check_running(self.replay is not None and not self.replay.done)
        assert self.replay is not None
        k = self._check_action(action)
        st = self.replay.step(k)
        self.tracker.update(st)
        reward = step_reward(st, self.profile)
        done = self.replay.done
        info = {"k": k, "batch": st.batch, "produced": st.produced, "time_ms": st.time_ms,
                "queue": st.queue, "finished": st.finished}
        if not done:
            self.state = self.replay.state()
            obs = self.tracker.observation(self.state)
        else:
            obs = np.zeros(len(BATCH_FEATURE_NAMES), np.float32)
            info["throughput_tok_s"] = self.replay.throughput()
        return obs, float(reward), done, False, info


def check_serving_keys(cfg: dict[str, Any], what: str) -> None:
    """One-line errors for the configuration keys every serving env shares."""
    source_key(cfg, "workload", (Workload,), what=what)
    source_key(cfg, "batch_profile", (BatchCostProfile,), what=what)
    int_key(cfg, "requests", 1, what=what)
    int_key(cfg, "max_batch", 1, what=what)
    int_key(cfg, "k_max", -(2**62), what=what)
    int_key(cfg, "outcome_seed", allow_none=True, what=what)


def open_serving(cfg: dict[str, Any]) -> tuple[Workload, BatchCostProfile, int, np.ndarray]:
    """A serving env's workload, batch profile, draft cap (checked against the profile) and request pool."""
    wl = cfg["workload"]
    workload = wl if isinstance(wl, Workload) else cached_workload(wl)
    bp = cfg["batch_profile"]
    profile = bp if isinstance(bp, BatchCostProfile) else load_batch_profile(bp)
    k_max = check_k_max(cfg["k_max"])
    profile.check_k_max(k_max)
    pool = workload.split_indices(cfg["split"])
    if len(pool) == 0:
        raise SpecgymError(f"workload {workload.name!r} has no requests in split {cfg['split']!r}")
    return workload, profile, k_max, pool


def step_reward(st: Any, profile: Any) -> float:
    """A serving step's reward: tokens produced minus what plain decoding of the same batch makes in its time, per
    sequence (plain decoding's rate from the profile's one-token verify at this batch size, cached per size)."""
    plain_rate = st.batch / profile.row(st.batch)[1][0]
    return float((st.produced - st.time_ms * plain_rate) / st.batch)


SpecDecodeBatchEnv.__doc__ = (SpecDecodeBatchEnv.__doc__ or "").format(features="\n    ".join(
    f"{i:>2}  {n:<16} {d}" for i, (n, d) in enumerate(zip(BATCH_FEATURE_NAMES, BATCH_FEATURE_DOCS))))
