"""CLI entry points and the benchmark on tiny budgets (smoke tests: they run the real code)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlbalance.cli import main


def test_cli_train_writes_summary(tmp_path, capsys):
    rc = main(["train", "--run.total_steps", "6000", "--run.out_dir", str(tmp_path), "--run.name", "cli",
               "--set", "telemetry.progress=false", "--telemetry.tensorboard", "false"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "sustained FPS" in out
    s = json.load(open(tmp_path / "cli" / "summary.json"))
    assert s["steps"] >= 6000
    used = json.load(open(tmp_path / "cli" / "config.json"))
    assert used["telemetry"]["tensorboard"] is False


def test_cli_help_lists_documented_fields():
    out = subprocess.run([sys.executable, "-m", "rlbalance", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "--learner.batch_size" in out.stdout and "Unrolls (single-env trajectories)" in out.stdout


def _strict(path):
    def refuse(name):
        raise ValueError(f"{path}: not strict JSON ({name})")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def test_every_committed_result_file_is_strict_json():
    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    files = [p for p in results.rglob("*.json") if not {"runs", "scratch"} & set(p.relative_to(results).parts)]
    assert len(files) > 20
    for p in files:
        _strict(p)


@pytest.mark.slow
def test_bench_trainer_tiny(tmp_path):
    from rlbalance.bench.trainer import run_workload, write_results

    r = run_workload("cartpole", [1], e2e_steps=6000, seconds=0.5, out=tmp_path, progress=lambda *_: None,
                     peer_steps=4096)
    row = r["rows"][0]
    assert row["env_ceiling_sps"] > 0 and row["learner_ceiling_sps"] > 0 and row["e2e_sps"] > 0
    prev = run_workload("cartpole-previous", [1], e2e_steps=6000, seconds=0.5, out=tmp_path,
                        progress=lambda *_: None, peer_steps=0)
    assert prev["config"]["run"]["preset"] == "none" and r["config"]["run"]["preset"] == "classic"
    md = write_results([r, prev], tmp_path)
    text = md.read_text()
    assert "| 1 |" in text and "e2e / min(ceilings)" in text and "shared-core estimate" in text
    # 6,000 steps end fewer than 100 CartPole episodes per run only sometimes: a return that is not a number
    # must come out as null, never NaN (strict JSON)
    r["rows"][0]["episode_return_last100"] = float("nan")
    write_results([r, prev], tmp_path)
    assert _strict(tmp_path / "trainer.json")["workloads"][0]["rows"][0]["episode_return_last100"] is None
    assert "cartpole with its preset against cartpole-previous" in text
    assert (tmp_path / "trainer.png").stat().st_size > 1000
    doc = json.load(open(tmp_path / "trainer.json"))
    assert doc["workloads"][0]["best"]["actors"] == 1
    assert doc["workloads"][0]["peer_ppo_envpool"]["sps"] > 0
    assert doc["preset_vs_previous"]["cartpole"] == doc["workloads"][0]["best"]["e2e_fps"] / prev["best"]["e2e_fps"]


def test_telemetry_overhead_bench_tiny(tmp_path):
    from rlbalance.bench.telemetry_overhead import run_overhead

    r = run_overhead(steps=6000, repeats=1, out=tmp_path, progress=lambda *_: None)
    assert len(r["sps_on"]) == len(r["sps_off"]) == 1 and r["median_off"] > 0
    assert "Overhead:" in (tmp_path / "telemetry-overhead.md").read_text()
    assert (tmp_path / "telemetry-overhead.png").exists()


@pytest.mark.slow
def test_sweep_bench_tiny(tmp_path):
    from rlbalance.bench.sweep_bench import run_bench_sweep

    r = run_bench_sweep(tmp_path, [1, 2], 6000, "cartpole")
    c = r["cartpole"]  # R = 1 or 2; a knee at 2, the edge of this sweep, is not bracketed and not reported
    assert c["best_R_swept"] in (1, 2) and c["throughput_optimal_R"] == (1 if c["best_R_swept"] == 1 else None)
    assert c["knee_bracketed"] == (c["best_R_swept"] == 1)
    assert c["best_R_swept"] == 1 or any("extend the sweep to R > 2" in w for w in c["warnings"])
    assert (tmp_path / "sweep" / "cartpole" / "ratio.html").exists()
    assert (tmp_path / "sweep" / "sweep.db").exists()


@pytest.mark.slow
def test_planner_bench_tiny_and_resumed(tmp_path, capsys):
    from rlbalance.bench.planner_validation import parse_workloads, run_validation
    from rlbalance.core.errors import ConfigError

    with pytest.raises(ConfigError, match="'cartpol' is neither a planner workload .* nor an env that can be made"):
        parse_workloads("cartpole,cartpol")
    assert parse_workloads("cartpole,MountainCar-v0") == ["cartpole", "MountainCar-v0"]  # any env id
    r = run_validation(tmp_path, [1], seconds=4.0, workloads=["synthetic-20us"], quick=True)
    assert r["workloads"] == 1 and r["points"] == 1 and r["worst_abs_error"] >= 0
    doc = _strict(tmp_path / "planner" / "planner-validation.json")
    point = doc["workloads"]["synthetic-20us"]["points"][0]
    assert point["measured_fps"] > 0 and point["predicted_fps"] > 0
    lo, hi = point["predicted_fps_range"]
    assert lo < point["predicted_fps"] < hi
    text = (tmp_path / "planner" / "planner-validation.md").read_text()
    assert "| synthetic-20us | 1 |" in text and "Targets" in text
    assert (tmp_path / "planner" / "planner-validation.png").stat().st_size > 1000
    capsys.readouterr()
    again = run_validation(tmp_path, [1], seconds=4.0, workloads=["synthetic-20us"], quick=True)  # resumes
    out = capsys.readouterr().out
    assert "calibration kept" in out and "done before, skipped" in out
    assert again["median_abs_error"] == r["median_abs_error"]
    # an env id as a workload (its family's preset); the report keeps the workload validated before in this folder
    both = run_validation(tmp_path, [1], seconds=4.0, workloads=["synthetic"], quick=True)
    assert both["workloads"] == 2 and (tmp_path / "planner" / "calibration-synthetic.json").is_file()
    assert set(_strict(tmp_path / "planner" / "planner-validation.json")["workloads"]) == {"synthetic-20us", "synthetic"}


@pytest.mark.slow
def test_seeds_bench_tiny(tmp_path, capsys):
    assert main(["bench", "seeds", "--seeds", "2", "--steps", "4000", "--out", str(tmp_path),
                 "--set", "learner.max_grad_norm=2"]) == 0
    doc = json.load(open(tmp_path / "seeds.json"))
    assert doc["overrides"] == {"learner": {"max_grad_norm": "2"}}
    assert [(r["mode"], r["seed"]) for r in doc["runs"]] == [("central", 0), ("central", 1)]
    assert all(r["curve"] and r["best"] >= r["final"] > 0 for r in doc["runs"])
    assert doc["summary"]["central"]["seeds"] == 2
    assert "| central | 2 |" in (tmp_path / "seeds.md").read_text()
    assert (tmp_path / "seeds.png").stat().st_size > 1000
    assert main(["bench", "seeds", "--modes", "remote", "--out", str(tmp_path / "bad")]) == 2
    assert "--modes" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["bench", "seeds", "--set", "learner.max_grad_norm=-1", "--out", str(tmp_path / "bad")]) == 2
    assert "learner.max_grad_norm" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_seeds_bench_reports_r2d2s_least_exploring_envs_apart(tmp_path):
    assert main(["bench", "seeds", "--seeds", "1", "--steps", "6000", "--out", str(tmp_path),
                 "--set", "learner.agent=r2d2"]) == 0
    doc = json.load(open(tmp_path / "seeds.json"))
    run = doc["runs"][0]
    assert run["greedy_curve"] and run["greedy_best"] >= run["greedy_final"] > 0
    assert doc["summary"]["central"]["median_greedy_best"] == run["greedy_best"]
    assert "explore least" in (tmp_path / "seeds.md").read_text()


def _refuse(name):
    raise ValueError(f"not strict JSON: {name}")


def test_pong_curve_files_from_a_run(cfg_factory, tmp_path):
    """bench pong-curve --from-run: curve files in strict JSON with milestones, and the final policy as a
    run directory that rlbalance eval plays (a short synthetic run stands in for Pong)."""
    from rlbalance.bench.pong_curve import write_curve
    from rlbalance.cli import main as cli_main
    from rlbalance.runtime.train import train

    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 50.0, "synthetic_episode_len": 20},
                          run={"total_steps": 30_000, "name": "curve"}, telemetry={"tensorboard": False,
                                                                                   "log_interval_s": 0.2}))
    out = tmp_path / "curve-out"
    r = write_curve(Path(s["run_dir"]), out)
    doc = json.loads((out / "pong-curve.json").read_text(), parse_constant=_refuse)
    assert doc["frames"] == s["frames"] and doc["run_dir"] == "curve" and set(doc["milestones"]) == {"-15", "+18"}
    assert (out / "pong-curve.png").stat().st_size > 0 and (out / "pong-curve.csv").read_text().count("\n") > 2
    from rlbalance.bench.pong_curve import plot_seeds

    plot_seeds([out / "pong-curve.json", out / "pong-curve.json"], tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").stat().st_size > 0
    # cut at a budget, a curve's label reads the value at the budget: a run stopped there logs its last point a batch
    # past it (its table's final value); a longer run is read at its last point before the cut
    pts = [{"frames": 9_986_048, "wall_s": 1.0, "return": 609.25},
           {"frames": 10_002_432, "wall_s": 2.0, "return": 604.15}]
    (tmp_path / "ended.json").write_text(json.dumps(dict(doc, curve=pts, milestones={})))
    longer = pts + [{"frames": 10_012_000, "wall_s": 3.0, "return": 700.0}]
    (tmp_path / "longer.json").write_text(json.dumps(dict(doc, curve=longer, milestones={})))
    labels = plot_seeds([tmp_path / "ended.json", tmp_path / "longer.json"], tmp_path / "cut.png",
                        names=["ended", "longer"], max_frames=10_000_000)
    assert labels == ["ended (+604.1 at 10.0M)", "longer (+609.2 at 10.0M)"], labels
    # one recorded batch (8 unrolls of 128 steps, frameskip 4: 4,096 frames) past a 2M budget is still its end
    short = [{"frames": 1_990_000, "wall_s": 1.0, "return": 240.0},
             {"frames": 2_002_944, "wall_s": 2.0, "return": 247.5}]
    (tmp_path / "short.json").write_text(json.dumps(dict(doc, curve=short, milestones={}, env_config={"frameskip": 4},
                                                         learner={"batch_size": 8, "unroll_length": 128})))
    assert plot_seeds([tmp_path / "short.json"], tmp_path / "short.png", names=["s"], max_frames=2_000_000) == \
        ["s (+247.5 at 2.0M)"]
    assert r["outcome"] == "completed"
    assert cli_main(["eval", str(out / "policy"), "--episodes", "2", "--envs", "2", "--out", str(tmp_path / "ev")]) == 0


def test_version(capsys):
    import re

    import pytest

    import rlbalance

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlbalance {rlbalance.__version__}"
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == rlbalance.__version__


def _help(capsys, *argv):
    import pytest

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_help_shows_one_default_typed_values_and_examples_as_written(capsys):
    import re

    from rlbalance.cli import SUBCOMMANDS

    for cmd in SUBCOMMANDS:
        text = _help(capsys, cmd)
        assert "(default: None)" not in text, cmd
        assert not re.search(r"--\w+\.\w+ V\b", text), cmd  # every config field says what it takes
        # one default per option: split the options part into one block per option
        blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[-1])
        for b in blocks:
            assert len(re.findall(r"\(default: ", b)) <= 1, (cmd, b)
    train = _help(capsys, "train")
    assert "--env.backend {gymnasium,envpool}" in train and "--run.total_steps INT" in train
    assert "--learner.hidden_sizes INT,..." in train and "--telemetry.tensorboard {true,false}" in train
    assert "(default: 'CartPole-v1')" in " ".join(train.split())  # help text wraps anywhere
    bench = _help(capsys, "bench")  # the examples keep their lines
    assert "\n  rlbalance bench trainer                      # CartPole and Pong" in bench


def test_dashes_and_underscores_both_work_in_field_names():
    from rlbalance import config as C
    from rlbalance.cli.options import cli_overrides, normalize_option

    assert normalize_option("--run.total-steps") == "--run.total_steps"
    assert normalize_option("--run.name=my-run") == "--run.name=my-run"  # a value keeps its dashes
    assert normalize_option("--from-run") == "--from-run"  # plain options are left alone
    assert C.parse_set(["learner.batch-size=8"]) == {"learner": {"batch_size": "8"}}
    import argparse

    from rlbalance.cli.options import add_config_arguments

    p = argparse.ArgumentParser()
    add_config_arguments(p)
    args = p.parse_args([normalize_option(a) for a in ["--run.total-steps", "1000", "--learner.batch-size=8"]])
    assert cli_overrides(args) == {"run": {"total_steps": "1000"}, "learner": {"batch_size": "8"}}


def test_shell_completion_of_commands_and_config_fields(tmp_path):
    """argcomplete's protocol, as a shell hook drives it: the command line so far in, the completions out."""
    import os

    out = tmp_path / "completions"

    def complete(line):
        env = dict(os.environ, _ARGCOMPLETE="1", COMP_LINE=line, COMP_POINT=str(len(line)),
                   _ARGCOMPLETE_STDOUT_FILENAME=str(out))
        subprocess.run([sys.executable, "-m", "rlbalance"], env=env, check=True, timeout=120)
        return out.read_text().replace("\x0b", "\n").split()

    assert "train" in complete("rlbalance tr")
    assert complete("rlbalance train --learner.batch") == ["--learner.batch_size"]


@pytest.mark.slow
def test_wheel_holds_only_rlbalance_and_works_outside_the_source_tree(tmp_path):
    """The built wheel installs one top-level package, `rlbalance` (the benchmarks inside it), with its data;
    installed apart from the source tree, `--version`, `bench trainer --help` and a short training run work."""
    import os
    import zipfile

    root = Path(__file__).parents[2]
    import importlib.util

    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w",
                    str(tmp_path / "dist"), str(root)], check=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("rlbalance-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"rlbalance"}, top
    assert "rlbalance/bench/trainer.py" in names and "rlbalance/data/systems.yaml" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, timeout=600)
    env = dict(os.environ, PYTHONPATH=str(site))  # the installed copy, ahead of the editable source tree
    work = tmp_path / "elsewhere"
    work.mkdir()

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rlbalance", *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)

    where = subprocess.run([sys.executable, "-c", "import rlbalance, rlbalance.bench.trainer as t; print(t.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where
    import rlbalance

    assert cli("--version").stdout.strip() == f"rlbalance {rlbalance.__version__}"
    h = cli("bench", "trainer", "--help")
    assert h.returncode == 0 and "cartpole-previous" in h.stdout
    r = cli("train", "--run.total_steps", "3000", "--run.mode", "serial", "--telemetry.progress", "false",
            "--telemetry.tensorboard", "false", "--telemetry.report", "false", "--run.name", "w")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((work / "runs" / "w" / "summary.json").read_text())["outcome"] == "completed"
