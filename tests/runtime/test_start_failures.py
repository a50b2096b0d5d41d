"""A run whose actors cannot start stops at the first failure with the actor's own error, leaving no run directory;
the README's Python example runs as printed, and without its __main__ guard stops at once with one line."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlbalance import config as C
from rlbalance.cli import main
from rlbalance.runtime.actor_pool import ActorStartFailure
from rlbalance.runtime.train import train

README = Path(__file__).resolve().parents[2] / "README.md"
QUIET = {"telemetry": {"progress": False, "tensorboard": False}}


def test_an_actor_that_cannot_start_stops_the_run_with_its_error(tmp_path):
    cfg = C.build({"env": {"id": "custom_envs:BrokenInActors-v0"}, "run": {"out_dir": str(tmp_path / "runs")},
                   "actors": {"max_restarts": 10}, **QUIET})
    with pytest.raises(ActorStartFailure, match="actor . could not start: RuntimeError: BrokenInActors") as e:
        train(cfg)
    assert "Traceback" in str(e.value.__cause__) and "no simulator licence" in str(e.value.__cause__)
    assert not list((tmp_path / "runs").iterdir())  # the new run never started: no directory left


def test_cli_shows_the_actors_traceback_once(tmp_path, capsys):
    rc = main(["train", "--env.id", "custom_envs:BrokenInActors-v0", "--run.out_dir", str(tmp_path),
               "--telemetry.progress", "false"])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.count("Traceback") == 1 and "no simulator licence" in err.strip().splitlines()[-1]  # once, then why
    assert err.strip().splitlines()[-1].startswith("rlbalance train: error: actor")


def _readme_api_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if "from rlbalance import config, train" in b)


def _run_script(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "example.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_readme_python_example_runs_as_printed(tmp_path):
    code = _readme_api_example()
    assert 'if __name__ == "__main__":' in code
    out = _run_script(tmp_path, code)
    assert out.returncode == 0, out.stderr[-3000:]
    ret, run_dir = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert float(ret) > 0 and (tmp_path / run_dir / "summary.json").is_file()


@pytest.mark.slow
def test_readme_python_example_without_the_guard_stops_in_one_line(tmp_path):
    lines = _readme_api_example().splitlines()
    guard = next(i for i, line in enumerate(lines) if line.startswith("if __name__"))
    body = textwrap.dedent("\n".join(lines[guard + 1:]))  # the same calls at the script's top level
    out = _run_script(tmp_path, "\n".join(lines[:guard]) + "\n" + body + "\n")
    assert out.returncode != 0
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "__main__" in err[0], out.stderr[-3000:]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_learner_ranks_of_a_script_without_the_guard_stop_it_in_one_line(tmp_path):
    # learner.devices=2: rank 1 is spawned before any actor, and dies importing the script; rank 0 names the cause at
    # once instead of waiting for rank 1 to join the process group
    code = textwrap.dedent("""
        from rlbalance import config, train

        cfg = config.build({"env": {"id": "CartPole-v1"}, "learner": {"devices": 2},
                            "run": {"out_dir": "runs", "total_steps": 2000}, "telemetry": {"progress": False}})
        train(cfg)
    """)
    out = _run_script(tmp_path, code)
    assert out.returncode != 0
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "learner rank 1" in err[0] and "__main__" in err[0], out.stderr[-3000:]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
