"""A specgym batch controller as SGLang's AdaptiveSpecPolicy (agents/sglang_policy.py), driven through the Protocol's
calls as SGLang 0.5.23's AdaptiveController makes them (no SGLang install needed): its decisions must be IDENTICAL
to the controller's own in specgym's batched replay."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Protocol, runtime_checkable

import numpy as np
import pytest

from specgym.agents.artifact import random_artifact, write_artifact
from specgym.agents.batch_policy import BatchPolicyController
from specgym.agents.sglang_export import write_sglang_module
from specgym.agents.sglang_policy import SpecgymSGLangPolicy, sglang_params_factory
from specgym.agents.specs import make
from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.synthetic import generate_workload
from specgym.errors import SpecgymError

PROFILE = "batch-cpu-midpair"


@runtime_checkable
class AdaptiveSpecPolicy(Protocol):
    """SGLang 0.5.23's Protocol (sglang/srt/speculative/adaptive_runtime_state.py), member for member."""

    @property
    def candidate_steps(self) -> list[int]: ...

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None: ...

    def get_steps_for_batch(self, batch_size: int) -> int: ...

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None: ...

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None: ...


class FakeController:
    """What SGLang 0.5.23's AdaptiveController does with a policy: init_states asks for the candidates and their
    CUDA-graph batch sizes; before each decode batch activate_step_by_batch(bs) -> get_steps_for_batch(bs); after
    its verification on_verify_complete(accepted, batch_size=bs), switching when a step comes back."""

    def __init__(self, policy: AdaptiveSpecPolicy, cuda_graph_bs: list[int]):
        self.policy = policy
        policy.set_cuda_graph_bs(cuda_graph_bs)
        self.states = {s: policy.cuda_graph_bs_for_step(s) for s in policy.candidate_steps}
        self.active: int | None = None

    def activate_step_by_batch(self, batch_size: int) -> None:
        target = self.policy.get_steps_for_batch(batch_size)
        assert target in self.states, f"step {target} has no runtime state"
        self.active = target

    def on_verify_complete(self, accepted: list[int], batch_size: int) -> None:
        new = self.policy.on_verify_complete(accepted, batch_size=batch_size)
        if new is not None:
            self.active = new


@pytest.fixture(scope="module")
def workload():
    return generate_workload("speclane-mix", 60, seed=3)


def _replay(workload, ctrl: BatchController) -> list[tuple[int, int, list[int]]]:
    """specgym's batched replay of ``ctrl`` (concurrency changing over time): per step (batch size, its K, the
    accepted counts)."""
    eng = BatchReplay(workload, load_batch_profile(PROFILE), concurrency=[(40.0, 2), (40.0, 12), (40.0, 5)],
                      k_max=8, seed=1)
    ctrl.reset(eng.profile, eng.k_max)
    seq = []
    while not eng.done:
        state = eng.state()
        k = ctrl.propose(state)
        step = eng.step(k)
        ctrl.observe(step)
        seq.append((state.batch, int(k), step.accepted.tolist()))
    return seq


def _drive(policy: SpecgymSGLangPolicy, seq: list[tuple[int, int, list[int]]]) -> list[int]:
    sglang = FakeController(policy, cuda_graph_bs=[1, 2, 4, 8, 16])
    out = []
    for bs, _, accepted in seq:
        sglang.activate_step_by_batch(bs)
        out.append(sglang.active)
        sglang.on_verify_complete(accepted, bs)
    return out


class SGLangView(BatchController):
    """A controller shown a replay as SGLang shows it to a policy (no queue, the concurrency = the batch, every
    request's planned K = the step's K): the view the adapter documents, for controllers that read more."""

    def __init__(self, inner: BatchController):
        self.inner, self.name = inner, inner.name

    def reset(self, profile, k_max):
        self.inner.reset(profile, k_max)
        self.profile = profile

    def propose(self, state):
        self.k = int(self.inner.propose(BatchState(state.batch, 0, state.batch, np.arange(state.batch),
                                                   np.zeros(0, np.int64))))
        return self.k

    def observe(self, step):
        b = step.batch
        planned = np.full(b, self.k)
        self.inner.observe(BatchStep(b, 0, np.arange(b), planned, step.accepted, int(step.accepted.sum()) + b,
                                     self.profile.step_time(b, self.k), 0, planned, self.k))


def test_conforms_to_the_protocol():
    policy = SpecgymSGLangPolicy("sglang-adaptive", candidate_steps=[0, 1, 3, 5, 7])
    assert isinstance(policy, AdaptiveSpecPolicy)
    assert policy.candidate_steps == [0, 1, 3, 5, 7]
    assert policy.cuda_graph_bs_for_step(3) is None  # no graphs until SGLang says so
    policy.set_cuda_graph_bs([8, 1, 4])
    assert policy.cuda_graph_bs_for_step(3) == [1, 4, 8] and policy.cuda_graph_bs_for_step(2) == []
    assert policy.get_steps_for_batch(4) in policy.candidate_steps
    assert policy.on_verify_complete([1, 0, 2, 3], 4) is None
    assert policy.on_verify_complete([1, 0], 0, num_steps=3) is None  # a fork's third argument; bs from the list


def test_sglang_adaptive_identical_to_the_replay(workload):
    seq = _replay(workload, make("sglang-adaptive", 8, kinds=("batch",)))
    assert len({bs for bs, _, _ in seq}) >= 3 and len({k for _, k, _ in seq}) >= 2  # a sequence that can differ
    got = _drive(SpecgymSGLangPolicy("sglang-adaptive", k_max=8), seq)
    assert got == [k for _, k, _ in seq]


@pytest.mark.parametrize("spec", ["goodput", "ppo-random"])
def test_profile_priced_controllers_identical_under_sglangs_view(workload, spec):
    def build():
        if spec == "ppo-random":  # an exported batch-mode policy (random weights: a test fixture, not a result)
            return BatchPolicyController(random_artifact("batch", k_max=8, seed=11))
        return make(spec, 8, kinds=("batch",))

    seq = _replay(workload, SGLangView(build()))
    assert len({k for _, k, _ in seq}) >= 2
    got = _drive(SpecgymSGLangPolicy(build(), k_max=8, profile=PROFILE), seq)
    assert got == [k for _, k, _ in seq]


def test_clamps_to_candidates_and_refuses_per_sequence_decisions():
    policy = SpecgymSGLangPolicy("static:6", candidate_steps=[0, 1, 3, 5], k_max=8)
    assert policy.get_steps_for_batch(2) == 5
    assert SpecgymSGLangPolicy("static:0", candidate_steps=[1, 3]).get_steps_for_batch(2) == 1
    with pytest.raises(SpecgymError, match="not a batch controller|batch"):
        SpecgymSGLangPolicy("speclane")  # a chain controller
    with pytest.raises(SpecgymError, match="accepted counts for batch_size"):
        policy.on_verify_complete([1, 2, 3], 2)


def test_params_factory_keeps_the_initial_steps():
    policy = sglang_params_factory("table:[[1, 4, 3], [5, 512, 1]]", candidate_steps=[1, 3])(initial_steps=5)
    assert policy.candidate_steps == [1, 3, 5]
    assert [policy.get_steps_for_batch(b) for b in (1, 4, 5, 64)] == [3, 3, 1, 1]


def test_real_sglang_controller_if_installed():
    mod = pytest.importorskip("sglang.srt.speculative.adaptive_runtime_state")

    class Worker:
        speculative_num_steps = 3

        def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens,
                                         cuda_graph_bs=None):
            return speculative_num_steps

        def apply_runtime_state(self, state):
            self.speculative_num_steps = state

    worker = Worker()
    ctl = mod.AdaptiveController(worker, SpecgymSGLangPolicy("table:[[1, 4, 3], [5, 512, 1]]", [1, 3]))
    ctl.init_states(None)
    ctl.activate_step_by_batch(8)
    assert worker.speculative_num_steps == 1


_DRIVER = """
import json, sys, importlib.util
sys.modules["specgym"] = None  # the module must not need specgym
spec = importlib.util.spec_from_file_location("exported", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["exported"] = mod
spec.loader.exec_module(mod)
policy = mod.make_policy(initial_steps=3)
out = []
for bs, _, accepted in json.load(sys.stdin):
    out.append(policy.get_steps_for_batch(bs))
    policy.on_verify_complete(accepted, bs)
print(json.dumps({"steps": out, "candidates": policy.candidate_steps}))
"""


def test_export_to_sglang_module_is_self_contained_and_identical(workload, tmp_path):
    art = random_artifact("batch", k_max=8, seed=11)  # random weights: a test fixture, not a result
    write_artifact(art, tmp_path / "pol")
    out = tmp_path / "my_policy.py"
    res = subprocess.run([sys.executable, "-m", "specgym", "export", str(tmp_path / "pol"), "--to", "sglang",
                          "--profile", PROFILE, "--max-batch", "64", "--out", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "import specgym" not in text and "from specgym" not in text
    seq = _replay(workload, SGLangView(BatchPolicyController(art)))
    assert max(bs for bs, _, _ in seq) <= 64 and len({k for _, k, _ in seq}) >= 2
    run = subprocess.run([sys.executable, "-c", _DRIVER, str(out)], input=json.dumps(seq), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["steps"] == [k for _, k, _ in seq]
    assert got["candidates"] == list(range(9))


def test_export_to_sglang_refusals(tmp_path):
    prof = load_batch_profile(PROFILE)
    with pytest.raises(SpecgymError, match="batch-mode policy"):
        write_sglang_module(random_artifact("k", k_max=8), prof, tmp_path / "p.py")
    with pytest.raises(SpecgymError, match=r"\.py file"):
        write_sglang_module(random_artifact("batch", k_max=8), prof, tmp_path / "p-1.txt")
    with pytest.raises(SpecgymError, match="candidate-steps"):
        write_sglang_module(random_artifact("batch", k_max=8), prof, tmp_path / "p.py", candidate_steps=[0, 9])
    assert not list(tmp_path.iterdir())
