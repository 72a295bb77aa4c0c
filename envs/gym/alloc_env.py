"""Gymnasium environment of the learned allocator: set each serving step's verification budget.

Registered by ``import specgym`` as ``specgym/SpecDecodeAlloc-v0``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from gymnasium import spaces

import specgym.catalogue as catalogue
from specgym.agents.alloc_policy import ALLOC_FEATURE_DOCS, ALLOC_FEATURE_NAMES, ALLOC_GAMMAS, AllocCore
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, load_predictor, workload_predictions
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.batch_engine import CONCURRENCIES, BatchReplay
from specgym.envs.gym.batch_env import check_serving_keys, open_serving, step_reward
from specgym.envs.gym.config import check_reset_options, source_key
from specgym.envs.gym.shell import EnvShell
from specgym.errors import SpecgymError
from specgym.paths import MODEL_ROOTS, default_workload_name


class SpecDecodeAllocEnv(EnvShell):
    """Choose the calibration of the budget allocator's survivals at every serving step (closed loop).

    ## Description
    Each step the budget allocator (``budget:logistic``) ranks every (request, draft position) slot by its estimated
    survival and verifies, and drafts, the top ``B``; the action sets how far the survivals are trusted
    (:data:`~specgym.agents.alloc_policy.ALLOC_GAMMAS`: ``s ** gamma``), hence the budget ``B``; the split across
    requests is the rule's. One episode serves ``requests`` requests (at least three per slot) in a closed loop at
    one concurrency, drawn per episode from the powers of two up to ``max_batch`` (``concurrency="sampled"``) or
    fixed (an int).

    ## Action Space
    ``Discrete(len(ALLOC_GAMMAS))``; the index of ``gamma = 1`` is the budget rule itself.

    ## Observation Space
    ``Box`` of float32 (:class:`~specgym.agents.alloc_policy.AllocCore`):

    {features}

    ## Rewards
    ``(produced - time_ms * b / verify(b, 1)) / b``, as the batch env: tokens gained over plain decoding at the same
    batch size in the same time, per sequence. An episode's tokens are fixed, so its return falls with its time.

    ## Starting State
    A concurrency drawn with ``np_random`` from the powers of two up to ``max_batch`` (``"sampled"``) or the fixed
    one, ``max(requests, 3 x concurrency)`` requests drawn without replacement from the split, and the outcome seed
    (``outcome_seed``, else drawn).

    ## Episode End
    Terminates when every request of the episode finished; never truncated.

    ## Arguments
    ``workload``, ``batch_profile`` (name, path or object), ``split``, ``requests``, ``concurrency`` (an int or
    ``"sampled"``), ``max_batch``, ``k_max``, ``outcome_seed``, ``predictor`` (an acceptance predictor, name, path or
    object, whose probabilities on the drafter's signals give the survivals; ``None``: the ``logistic`` estimator).

    ## Version History
    * v0: initial release.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    config_name = "alloc env"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Every configuration key with its default."""
        return {"workload": default_workload_name(), "batch_profile": "batch-a100-7b-roofline", "split": "train",
                "requests": 96, "concurrency": "sampled", "max_batch": 128, "k_max": DEFAULT_K_MAX,
                "outcome_seed": None, "predictor": None}

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self._merge_config(config, overrides)
        cfg = self.config
        check_serving_keys(cfg, self.config_name)
        source_key(cfg, "predictor", (AcceptancePredictor,), allow_none=True, what=self.config_name)
        conc = cfg["concurrency"]
        if not (conc == "sampled" or (isinstance(conc, int) and not isinstance(conc, bool) and conc >= 1)):
            raise SpecgymError(f"alloc env config concurrency: expected an integer >= 1 or 'sampled', got {conc!r}")
        self.workload, self.profile, self.k_max, self.pool = open_serving(cfg)
        self.sizes = [c for c in CONCURRENCIES if c <= int(cfg["max_batch"])] or [1]
        self.action_space = spaces.Discrete(len(ALLOC_GAMMAS))
        n = len(ALLOC_FEATURE_NAMES)
        self.observation_space = spaces.Box(np.zeros(n, np.float32), np.full(n, 2.0, np.float32), dtype=np.float32)
        pred = cfg["predictor"]
        if isinstance(pred, (str, os.PathLike)):
            pred = load_predictor(catalogue.resolve("predictor", str(pred)))
        self.predictor: AcceptancePredictor | None = pred
        self.signal = None if pred is None else workload_predictions(pred, self.workload, MODEL_ROOTS)
        self.core = AllocCore(self.k_max, pred)
        self.replay: BatchReplay | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start serving a fresh set of requests; returns ``(observation, info)``."""
        check_reset_options(options, ())
        super().reset(seed=seed)
        cfg, rng = self.config, self.np_random
        conc = cfg["concurrency"]
        conc = int(rng.choice(self.sizes)) if conc == "sampled" else int(conc)
        n = min(max(int(cfg["requests"]), 3 * conc), len(self.pool))
        reqs = rng.choice(self.pool, size=n, replace=False)
        oseed = cfg["outcome_seed"]
        self.replay = BatchReplay(self.workload, self.profile, conc, requests=reqs, k_max=self.k_max,
                                  seed=int(rng.integers(2**31)) if oseed is None else int(oseed),
                                  draft_signal=self.signal)
        self.core.reset(self.profile, self.k_max)
        self.state = self.replay.state()
        return self.core.observation(self.state), {"batch": self.state.batch, "concurrency": conc}

    def step(self, action: Any):
        """Play one step at the ``action``-th calibration."""
        self._check_running(self.replay is not None and not self.replay.done)
        assert self.replay is not None
        a = self._check_action(action)
        st = self.replay.step(self.core.decide(a))
        self.core.update(st)
        reward = step_reward(st, self.profile)
        done = self.replay.done
        info = {"gamma": ALLOC_GAMMAS[a], "batch": st.batch, "produced": st.produced, "time_ms": st.time_ms,
                "verified": int(st.planned_k.sum()), "finished": st.finished}
        if not done:
            self.state = self.replay.state()
            obs = self.core.observation(self.state)
        else:
            obs = np.zeros(len(ALLOC_FEATURE_NAMES), np.float32)
            info["throughput_tok_s"] = self.replay.throughput()
        return obs, float(reward), done, False, info


SpecDecodeAllocEnv.__doc__ = (SpecDecodeAllocEnv.__doc__ or "").format(features="\n    ".join(
    f"{i:>2}  {n:<17} {d}" for i, (n, d) in enumerate(zip(ALLOC_FEATURE_NAMES, ALLOC_FEATURE_DOCS))))
