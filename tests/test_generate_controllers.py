"""``specgym generate`` runs every shipped policy and the pair's recommended controller by what it is.

A controller's built row decides how it runs live (a learned row follows the policy it loaded: a drafter-mode policy
is a drafter-choice row, a tree policy a tree row), never the spec's prefix; the report's first finding was a
drafter-mode policy handed to the chain engine (``TypeError``). The real pair's runs convert its GGUF target once
and are slow tests.
"""

from __future__ import annotations

import json

import pytest

import specgym.catalogue as catalogue
from specgym.agents.artifact import load_policy
from specgym.agents.modes import MODES
from specgym.cli import main
from specgym.errors import SpecgymError
from specgym.paths import RECOMMENDED_CONTROLLERS, default_pair_name


def _pair_of(policy: str) -> str:
    """The shipped pair a shipped policy was trained for (its workload's pair; a generalist: the default pair)."""
    workload = str(load_policy(catalogue.resolve("policy", policy)).meta["training"].get("workload") or "")
    pair = workload.split("-")[0]
    return pair if pair in catalogue.names("pair") else default_pair_name()


def _spec(policy: str) -> str:
    mode = MODES[load_policy(catalogue.resolve("policy", policy)).mode]
    return f"{mode.spec_prefix}:{policy}"


def _generate(capsys, *argv: str, tokens: int = 12) -> dict:
    code = main(["generate", *argv, "--max-new-tokens", str(tokens), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _real_pair_or_skip() -> None:
    try:
        catalogue.external_target("smollm2")
    except SpecgymError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("gguf")


POLICIES = catalogue.names("policy")


@pytest.mark.parametrize("policy", [p for p in POLICIES if _pair_of(p) != "smollm2"])
def test_every_shipped_policy_of_a_fixture_pair_runs_in_generate(policy, capsys):
    out = _generate(capsys, "--pair", _pair_of(policy), "--controller", _spec(policy), "--prompt", "def add(a, b):")
    assert out["greedy_identical"] is True and out["tokens"] == 12, out


@pytest.mark.slow
@pytest.mark.parametrize("policy", [p for p in POLICIES if _pair_of(p) == "smollm2"])
def test_every_shipped_policy_of_the_real_pair_runs_in_generate(policy, capsys):
    """``ppo:smollm2-drafter`` (the report's F1) and ``ppo:smollm2-token``, greedy and exact."""
    _real_pair_or_skip()
    out = _generate(capsys, "--pair", "smollm2", "--controller", _spec(policy), "--prompt",
                    "Repeat this sentence twice: the cat sat on the mat.")
    assert out["greedy_identical"] is True and 0 < out["tokens"] <= 12, out
    if load_policy(catalogue.resolve("policy", policy)).mode == "drafter":
        assert out["drafters"] == ["draft", "ngram", "head"] and all(
            r == "plain" or r.split(":")[0] in out["drafters"] for r in out["rounds"]), out


def test_every_shipped_policy_is_covered():
    """A new shipped policy joins the tests above by itself; its mode must be one generate runs."""
    assert {"smollm2-drafter", "smollm2-token", "midpair-tree"} <= set(POLICIES)
    for policy in POLICIES:
        assert MODES[load_policy(catalogue.resolve("policy", policy)).mode].kind in ("chain", "tree", "drafter")


@pytest.mark.slow
def test_the_real_pair_defaults_to_its_recommended_controller_and_stops_at_eos(capsys):
    """Without ``--controller`` the real pair runs its recommended drafter choice; its chat answer ends at EOS
    unless ``--no-stop-at-eos`` (then it runs on to ``--max-new-tokens``, into a turn the model invents)."""
    _real_pair_or_skip()
    prompt = "Repeat this sentence once: the cat sat on the mat."
    out = _generate(capsys, "--pair", "smollm2", "--prompt", prompt, tokens=40)
    assert out["controller"] == RECOMMENDED_CONTROLLERS["smollm2"][0] == "drafter-marginal", out
    assert out["tokens"] < 40 and "<|im_end|>" not in out["text"] and "cat sat" in out["text"], out
    out = _generate(capsys, "--pair", "smollm2", "--prompt", prompt, "--no-stop-at-eos", "--temperature", "0.5")
    assert out["controller"] == RECOMMENDED_CONTROLLERS["smollm2"][1] == "fixed:4@head", out  # no recording at 0.5
    assert out["tokens"] == 12, out


@pytest.mark.parametrize("argv, fragment", [
    (["--controller", ""], "--controller is empty"),
    (["--controller", "   "], "--controller is empty"),
    (["--prompt", ""], "--prompt is empty"),
    (["--prompt", "   "], "--prompt is empty"),
    (["--pair", "midpair", "--target", "x"], "give --pair or --draft/--target, not both (got --target too)"),
    (["--controller", "fixed:3@nothing"], "which the engine does not hold (it holds draft, ngram)"),
])
def test_generate_refuses_before_loading_a_model(argv, fragment, capsys, monkeypatch):
    """Each of the report's inputs is one line, and none of them loads a model first."""
    import specgym.commands.live as live

    monkeypatch.setattr(live, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    args = ["--prompt", "hi", *argv] if "--prompt" not in argv else list(argv)
    code = main(["generate", "--pair", "midpair", *args] if "--pair" not in argv else ["generate", *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
