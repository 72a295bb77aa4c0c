"""Stable-baselines3 callbacks of a PPO run: rollout metrics, validation, progress, critic warm-up.

Tensorboard scalars (stable names, CleanRL style): ``specdec/*`` from training rollouts, ``eval/*`` from validation
on the val split; SB3 adds its own ``train/*``, ``rollout/*`` and ``time/*``.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from stable_baselines3.common.callbacks import BaseCallback

from specgym.console import Progress
from specgym.io import atomic_path, atomic_write_bytes
from specgym.training.export import run_artifact
from specgym.training.run import TrainingRun
from specgym.training.run_folder import save_checkpoint
from specgym.training.sb3_actor import actor_parameters
from specgym.training.snapshot import save_snapshot
from specgym.training.validation import ValidationResult, Validator


class SpecDecMetricsCallback(BaseCallback):
    """Logs ``specdec/*`` from the env's ``info`` of training rollouts (at each rollout end).

    ``speedup_vs_ar`` = sum(N * t_AR) / sum(episode time) over episodes finished in the rollout; ``mean_k`` = mean
    drafted tokens per round, ``mean_planned_k`` = mean cap, ``accept_len`` = produced / rounds, ``draft_waste`` =
    (drafted - accepted) / drafted (the metrics of :mod:`specgym.eval.metrics`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._reset_sums()

    def _reset_sums(self) -> None:
        self.rounds = self.planned = self.drafted = self.accepted = self.produced = 0
        self.ep_tokens = 0
        self.ep_ar_time = self.ep_time = 0.0
        self.episodes = 0
        self.batch_steps = self.batch_k = self.batch_size = 0
        self.batch_tput: list[float] = []

    def _on_step(self) -> bool:
        for info, done in zip(self.locals["infos"], self.locals["dones"]):
            if "drafted" in info:
                self.rounds += 1
                self.planned += info["planned_k"]
                self.drafted += info["drafted"]
                self.accepted += info["accepted"]
                self.produced += info["produced"]
            elif "batch" in info and "k" in info:  # the batched serving env: one step of a whole batch
                self.batch_steps += 1
                self.batch_k += info["k"]
                self.batch_size += info["batch"]
            if done:
                self.episodes += 1
                if "throughput_tok_s" in info:
                    self.batch_tput.append(info["throughput_tok_s"])
                else:
                    self.ep_tokens += info["length"]
                    self.ep_ar_time += info["length"] * info["t_ar_ms"]
                    self.ep_time += info["episode_time_ms"]
        return True

    def _on_rollout_end(self) -> None:
        rec = self.logger.record
        if self.rounds:
            rec("specdec/mean_k", self.drafted / self.rounds)
            rec("specdec/mean_planned_k", self.planned / self.rounds)
            rec("specdec/accept_len", self.produced / self.rounds)
            rec("specdec/draft_waste", (self.drafted - self.accepted) / max(self.drafted, 1))
        if self.batch_steps:
            rec("specdec/mean_k", self.batch_k / self.batch_steps)
            rec("specdec/mean_batch", self.batch_size / self.batch_steps)
        if self.batch_tput:
            rec("specdec/throughput_tok_s", sum(self.batch_tput) / len(self.batch_tput))
        if self.episodes and self.ep_time > 0:
            rec("specdec/speedup_vs_ar", self.ep_ar_time / self.ep_time)
            rec("specdec/throughput_tok_s", self.ep_tokens / self.ep_time * 1000.0)
        if self.episodes:
            rec("specdec/episodes", self.episodes)
        self._reset_sums()


#: Validation figures logged as ``eval/<name>`` whenever measured (and ``eval/speedup_vs_<baseline>`` for each
#: compared baseline).
EVAL_SCALARS = ("speedup_vs_best_fixed", "oracle_ratio", "throughput_tok_s", "speedup_vs_ar", "mean_k")


class ValidationCallback(BaseCallback):
    """Every ``eval_freq`` timesteps: validate the current policy, log ``eval/*``, keep the best model.

    The policy is exported in memory (the same :class:`~specgym.agents.policy_controller.PolicyController` that
    ships) and run through :func:`specgym.eval.harness.evaluate` by the run's validator
    (:func:`specgym.training.validation.make_validator`). The best model by the validator's key is saved to
    ``best_model.zip`` + ``best_vecnormalize.pkl``.

    Args:
        run: The training run (its state keeps ``best``, ``val_history`` and ``last_eval_step``; the policy is
            priced with its acceptance predictor).
        validator: ``validate(artifact, max_requests) -> ValidationResult``.
        key: The figure the best model is kept by.
        console: A rich console for the one-line report of each validation.
        at_start: Also validate before the first update (the behaviour-cloned policy).
    """

    def __init__(self, run: TrainingRun, validator: Validator, key: str, console: Any, at_start: bool = False):
        super().__init__()
        self.run, self.validator, self.key, self.console = run, validator, key, console
        self.freq = int(run.config.ppo.eval_freq)
        self.at_start = at_start
        last = run.state.last_eval_step
        self.last = -1 if last is None else int(last)

    def _on_training_start(self) -> None:
        if self.at_start:
            self.evaluate_now()

    def _on_step(self) -> bool:
        if self.freq > 0 and self.num_timesteps - max(self.last, 0) >= self.freq:
            self.evaluate_now()
        return True

    def evaluate_now(self) -> ValidationResult:
        """Validate the current policy now (once per timestep count)."""
        self.last = self.num_timesteps
        run, state = self.run, self.run.state
        vec = self.model.get_vec_normalize_env()
        art = run_artifact(self.model, vec, run.config, run.predictor)
        t0 = time.perf_counter()
        res = self.validator(art, run.config.ppo.eval_max_requests)
        logged = [*EVAL_SCALARS, *(f"speedup_vs_{name}" for name in res.vs)]
        for key in dict.fromkeys(logged):
            value = res.figure(key)
            if value is not None and value == value:  # measured and not NaN
                self.logger.record(f"eval/{key}", value)
        kept = {"timesteps": self.num_timesteps, "speedup_vs_best_fixed": res.speedup_vs_best_fixed,
                self.key: res.figure(self.key)}
        state.val_history.append(kept)
        if state.best is None or kept[self.key] > state.best[self.key]:
            save_checkpoint(self.model, vec, run.files.best_model, run.files.best_vecnorm)
            state.best = dict(kept)
        state.last_eval_step = self.last
        run.save_state()  # the best model on disk and state.json always agree
        self.console.print(f"  [{self.num_timesteps:>9,} steps] val: {res.describe()} "
                           f"({time.perf_counter() - t0:.1f} s)", highlight=False)
        return res


class CheckpointCallback(BaseCallback):
    """Between two rollouts, on a cadence: the resume snapshot, ``model.zip`` + ``vecnormalize.pkl`` and a current
    ``state.json``, so a run killed outright (SIGKILL, power loss) can be exported and resumed.

    A checkpoint is taken at the first rollout, then whenever ``every_s`` seconds passed, and always before the
    run's last rollout (so extending a finished run continues from its end). Taking one changes nothing in the run.

    Args:
        run: The training run (its state is saved in the snapshot and as ``state.json``; its workload or domain
            distribution is stored by reference, see :mod:`specgym.training.snapshot`).
        target: The run's target timesteps.
        rollout: Timesteps per rollout (``n_envs * n_steps``).
        every_s: Seconds between checkpoints (0 = every rollout).
        done: The timesteps of a checkpoint that already exists (a resumed run does not retake it).
    """

    def __init__(self, run: TrainingRun, target: int, rollout: int, every_s: float, done: int | None = None):
        super().__init__()
        self.run = run
        self.target, self.rollout, self.every_s = int(target), int(rollout), float(every_s)
        self.last_step = done
        self.last_time: float | None = None if done is None else time.perf_counter()

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        n = self.num_timesteps
        if n == self.last_step:
            return
        due = self.last_time is None or time.perf_counter() - self.last_time >= self.every_s
        if due or n + self.rollout >= self.target:
            self.save()

    def save(self) -> None:
        """Take a checkpoint now (call only between two rollouts)."""
        n = int(self.num_timesteps)
        run, files = self.run, self.run.files
        run.state.status, run.state.timesteps_done, run.state.checkpoint_timesteps = "running", n, n
        vec = self.model.get_vec_normalize_env()
        assert vec is not None  # make_training_env always wraps the envs in VecNormalize
        model_bytes = save_snapshot(files.resume, self.model, vec, run.state.to_dict(), run.workload)
        atomic_write_bytes(files.model, model_bytes, overwrite=True)
        with atomic_path(files.vecnorm, overwrite=True) as tmp:
            vec.save(str(tmp))
        run.save_state()
        self.last_step, self.last_time = n, time.perf_counter()


class ProgressCallback(BaseCallback):
    """A rich progress bar over the target timesteps (steps/s shown); stops the run exactly at the target.

    SB3 collects whole rollouts; returning False from ``_on_step`` once ``total`` timesteps are reached ends
    ``learn`` there (the unfinished rollout is not trained on), so a run does exactly what was asked.
    """

    def __init__(self, total: int, start: int, console: Any):
        super().__init__()
        self.total, self.start, self.console = total, start, console
        self.bar: Any = None
        self.task: Any = None

    def _on_training_start(self) -> None:
        self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task("train", total=self.total, completed=self.start, rate="")
        self.t0, self.n0 = time.perf_counter(), self.start

    def _on_step(self) -> bool:
        if self.n_calls % 64 == 0:
            rate = (self.num_timesteps - self.n0) / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(self.task, completed=min(self.num_timesteps, self.total), rate=f"{rate:,.0f} steps/s")
        return self.num_timesteps < self.total

    def _on_training_end(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class CriticWarmupCallback(BaseCallback):
    """Actor parameters frozen (critic-only PPO updates) until ``warmup`` timesteps (after behaviour cloning)."""

    def __init__(self, warmup: int):
        super().__init__()
        self.warmup = int(warmup)

    def _set(self, frozen: bool) -> None:
        for p in actor_parameters(self.model):
            p.requires_grad_(not frozen)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:  # runs right before each PPO update
        self._set(self.num_timesteps < self.warmup)

    def _on_training_end(self) -> None:
        self._set(False)
