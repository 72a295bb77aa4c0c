"""Every CLI command driven with a table of bad values: one-line error, non-zero exit, and a pre-existing unrelated
file in the output location byte-identical afterwards (issue 17). In-process (``specgym.cli.main``), so it is fast.

The other CLI-error tests, by concern: ``test_cli_errors_options.py`` (bad flags and values, each with its message),
``test_cli_errors_inputs.py`` (bad files, fields and workloads), ``test_cli_outputs.py`` (outputs: overwrites,
atomic writes, interrupts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_workloads import WORKLOADS

from specgym.cli import main

PRECIOUS = b"the user's own bytes \x00\xff, never touched\n"

#: (command and its valid arguments, the output option's kind, bad value sets). ``{OUT}`` is the output location:
#: a folder holding the user's file (``dir``) or the user's file itself (``file``); ``{BAD}`` a non-UTF-8 file,
#: ``{DIR}`` a folder.
TABLE: list[tuple[list[str], str, list[list[str]]]] = [
    (["workloads", "make", "--preset", "speclane-mix", "--requests", "5", "--out", "{OUT}"], "file", [
        ["--requests", "0"], ["--requests", "-1"], ["--requests", "x"], ["--requests", "100000000000"],
        ["--preset", "nope"], ["--profile", "nope"], ["--profile", "{BAD}"], ["--profile", "{DIR}"],
        ["--seed", "-1"], ["--force", "--profile", "nope"], ["--out", "/dev/null", "--force"],
    ]),
    (["eval", "--workload", "assc-regimes", "--max-requests", "5", "--bootstrap", "0", "--no-plots",
      "--out", "{OUT}"], "dir", [
        ["--workload", "nope"], ["--workload", "{BAD}"], ["--workload", "{DIR}"], ["--controllers", "bogus"],
        ["--controllers", "fixed:99"], ["--controllers", ""], ["--k-max", "0"], ["--k-max", "17"],
        ["--split", "x"], ["--bootstrap", "5"], ["--bootstrap", "10000000000"], ["--max-requests", "0"],
        ["--profile", "nope"], ["--profile", "{BAD}"], ["--seed", "-1"], ["--force"],
        ["--force", "--controllers", "bogus"], ["--suite", "x"], ["--suite", "generalization", "--force"],
    ]),
    (["train", "--workload", "assc-regimes", "--timesteps", "64", "--out", "{OUT}"], "dir", [
        ["--timesteps", "0"], ["--timesteps", "1"], ["--mode", "x"], ["--hyperparams", "learning_rate="],
        ["--hyperparams", "bogus=1"], ["--hyperparams", "n_envs=-1"], ["--k-max", "0"], ["--workload", "nope"],
        ["--workload", "{BAD}"], ["--config", "nope.yaml"], ["--config", "{BAD}"], ["--init-from", "bogus:1"],
        ["--resume"], ["--force"], ["--force", "--resume"], ["--domains", "generalist"],
    ]),
    (["export", "{DIR}", "--out", "{OUT}"], "dir", [
        ["--which", "x"], [], ["--force"], ["--which", "final", "--force"],
    ]),
    (["tune", "vllm", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--max-batch", "8",
      "--out", "{OUT}"], "file", [
        ["--profile", "nope"], ["--profile", "{BAD}"], ["--profile", "speclane-table"], ["--max-batch", "0"],
        ["--workload", "nope"], ["--k-max", "99"], ["--split", "x"], ["--out", "{DIR}", "--force"],
    ]),
    (["tune", "roofline", "--target-params", "7e9", "--draft-params", "1e8", "--bandwidth-gb-s", "2000",
      "--peak-tflops", "300", "--out", "{OUT}"], "file", [
        ["--target-params", "-1"], ["--peak-tflops", "0"], ["--efficiency", "2"], ["--max-batch", "0"],
        ["--bandwidth-gb-s", "nan"], [],
    ]),
    (["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
      "--requests", "4", "--out", "{OUT}"], "file", [
        ["--controllers", "bogus"], ["--controllers", "static:99"], ["--controllers", "table:{BAD}"],
        ["--replications", "0"], ["--profile", "nope"], ["--max-batch", "0"],
    ]),
    (["generate", "--prompt", "hello", "--max-new-tokens", "4"], "none", [
        ["--k", "99"], ["--temperature", "-1"], ["--controller", "bogus"], ["--device", "tpu"],
        ["--dtype", "int3"], ["--draft", "x"], ["--k", "2", "--controller", "assc"], ["--profile", "{BAD}"],
    ]),
    (["record", "--prompts", "{PROMPTS}", "--out", "{OUT}"], "file", [
        ["--prompts", "nope.jsonl"], ["--prompts", "{BAD}"], ["--prompts", "{DIR}"], ["--max-new-tokens", "x"],
        ["--gen-k", "99"], ["--splits", "bogus"], ["--profile", "nope"], [],
        ["--force", "--profile-out", "{OUT}"], ["--out", "/dev/null", "--force"],
    ]),
    (["profile", "--out", "{OUT}"], "file", [
        ["--batch-sizes", "3,2"], ["--batch-sizes", "x"], ["--batch-sizes", ""], [], ["--dtype", "int3"],
        ["--out", "{DIR}", "--force"],
    ]),
    (["demo", "--workload", "assc-regimes", "--k-steps", "64", "--out", "{OUT}"], "dir", [
        ["--k-steps", "0"], ["--workload", "nope"], ["--force"], [],
    ]),
    (["bench", "--workload", "assc-regimes"], "none", [
        ["--sections", "bogus"], ["--sections", ""], ["--workload", "nope"], ["load", "--json", "{DIR}"], ["bogus"],
    ]),
    # issues 29 and 31: the new-user run's inputs (a user's recordings, predictors, tables, Ray, shards)
    (["workloads", "merge", "{MIDPAIR}", "--out", "{OUT}"], "file", [
        ["{OTHERPAIR}"], ["{MIDPAIR}"], ["assc-regimes"], ["{SHARDS}"],
    ]),
    (["workloads", "show"], "none", [
        ["{SHARDS}"], ["nope"], ["{BAD}"],
    ]),
    (["eval", "--workload", "{MIDPAIR}", "--bootstrap", "0", "--no-plots", "--out", "{OUT}"], "dir", [
        ["--workload", "{OTHERPAIR}", "--controllers", "predicted:midpair"],
        ["--workload", "{OTHERPAIR}", "--controllers", "planned:midpair,marginal"],
        ["--workload", "{OTHERPAIR}", "--controllers", "tree-predicted:midpair"],
        ["--workload", "{OTHERPAIR}", "--controllers", "ppo:midpair-predicted"],
        ["--workload", "{NOTRAIN}", "--split", "all", "--controllers", "tree-sequoia"],
        ["--workload", "{NOTRAIN}", "--split", "all", "--controllers", "tree-predicted:midpair"],
        ["--workload", "{SHARDS}", "--stream"],
    ]),
    (["train", "--workload", "{MIDPAIR}", "--mode", "token", "--timesteps", "64", "--out", "{OUT}"], "dir", [
        ["--workload", "{OTHERPAIR}", "--hyperparams", "predictor=midpair"],
        ["--workload", "assc-regimes", "--hyperparams", "predictor=midpair"],  # no signals to read
        ["--workload", "{NOSKETCH}", "--hyperparams", "predictor=midpair"],  # the predictor reads the sketch
        ["--mode", "k", "--hyperparams", "predictor=midpair"],
        ["--hyperparams", "n_envs=3"], ["--hyperparams", "bc_init=bogus"],
    ]),
    (["predictor", "train", "--workload", "{MIDPAIR}", "--out", "{OUT}"], "file", [
        ["--max-rows", "1"], ["--max-rows", "999"], ["--groups", "conf,hidden", "--workload", "{NOSKETCH}"],
        ["--workload", "{MIDPAIR},{OTHERPAIR}"],
    ]),
    (["predictor", "eval", "--predictor", "midpair", "--workload", "{MIDPAIR}", "--no-ablation",
      "--json", "{OUT}"], "file", [
        ["--bootstrap", "5"], ["--workload", "{OTHERPAIR}"], ["--workload", "assc-regimes"],
    ]),
    (["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
      "--requests", "4", "--out", "{OUT}"], "file", [
        ["--controllers", "table:[[1,64,3],[60,128,1]]"], ["--controllers", "table:[[1,64,3],[70,128,1]]"],
        ["--controllers", "table:[[1,64,99]]"], ["--controllers", "table:[[1,64,12]]"],
        ["--controllers", "table:[[2,64,3]]"], ["--controllers", "table:nofile.json"],
    ]),
    (["record", "--prompts", "{PROMPTS}", "--out", "{OUT}"], "file", [
        ["--splits", "0.5,0.5,0.5"], ["--splits", "1,0"], ["--hidden-sketch", "100000"],
        ["--workers", "2", "--profile", "cpu-tinypair", "--ray-address", "127.0.0.1:1"],
    ]),
    (["generate", "--prompt", "hello", "--max-new-tokens", "4"], "none", [
        ["--controller", "tree-predicted:midpair"], ["--controller", "tree-sequoia", "--temperature", "0.8"],
        ["--controller", "tree-bogus"],
    ]),
]

CASES = [pytest.param(base, kind, bad, id=f"{' '.join(base[:2])}|{' '.join(bad)}") for base, kind, bads in TABLE
         for bad in bads]


@pytest.mark.parametrize("base,kind,bad", CASES)
def test_bad_values_are_one_line_errors_and_touch_nothing(tmp_path, capsys, monkeypatch, base, kind, bad):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_bytes(PRECIOUS)
    badfile = tmp_path / "bad.bin"
    badfile.write_bytes(b"\xff\xfe\x00 not UTF-8, not JSON, not Parquet")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    if kind == "dir":
        out = tmp_path / "out"
        out.mkdir()
        precious = out / "notes.txt"
    else:
        out = tmp_path / "out.json"
        precious = out
    precious.write_bytes(PRECIOUS)

    made: dict[str, str] = {}

    def fill(arg: str) -> str:
        for key, make in WORKLOADS.items():
            if "{" + key + "}" in arg:
                if key not in made:
                    made[key] = str(make(tmp_path / "inputs"))
                arg = arg.replace("{" + key + "}", made[key])
        return (arg.replace("{OUT}", str(out)).replace("{BAD}", str(badfile)).replace("{DIR}", str(folder))
                .replace("{PROMPTS}", str(prompts)))

    argv = [fill(a) for a in base + bad]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0, argv
    assert err and "\n" not in err and "Traceback" not in err, err
    assert precious.read_bytes() == PRECIOUS and (folder / "keep.txt").read_bytes() == PRECIOUS
    if kind == "dir":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    leftovers = [p.name for p in Path(tmp_path).iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    if kind == "file":  # no partial recording, no shard folder next to the output
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(out.name)) == [out.name]
