"""`labeldp randomizer solve`: the JSON contract and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labeldp.cli import main


@pytest.fixture()
def prior_file(tmp_path: Path) -> Path:
    path = tmp_path / "prior.csv"
    lines = ["label,weight"] + [f"{y},{(y % 7) + 1}" for y in range(1, 53)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("mechanism", ["opt-unbiased", "rr-on-bins", "laplace", "staircase", "dbrr"])
def test_solve_prints_the_contract_fields(capsys, prior_file, mechanism):
    args = ["randomizer", "solve", "--mechanism", mechanism, "--epsilon", "1", "--labels", "1:52",
            "--prior-file", str(prior_file), "--json"]
    if mechanism == "opt-unbiased":
        args += ["--mesh", "52"]
    code, out, err = _run(capsys, *args)
    assert code == 0, err
    report = json.loads(out)
    assert {"mechanism", "epsilon", "certified_epsilon", "noisy_label_loss", "max_abs_bias", "num_outputs",
            "solve_seconds"} <= set(report)
    assert report["epsilon"] == 1.0
    assert 0.999 < report["certified_epsilon"] <= 1.0
    assert report["noisy_label_loss"] > 0
    if mechanism in ("opt-unbiased", "dbrr", "laplace", "staircase"):
        assert report["max_abs_bias"] <= 1e-6
    if mechanism == "opt-unbiased":
        assert report["mesh"] == 52 and report["num_outputs"] <= 52


def test_opt_unbiased_beats_the_other_unbiased_mechanisms_on_the_same_prior(capsys, prior_file):
    losses = {}
    for mechanism in ("opt-unbiased", "laplace", "staircase", "dbrr"):
        code, out, _ = _run(capsys, "randomizer", "solve", "--mechanism", mechanism, "--epsilon", "2",
                            "--labels", "1:52", "--prior-file", str(prior_file), "--json")
        assert code == 0
        losses[mechanism] = json.loads(out)["noisy_label_loss"]
    assert losses["opt-unbiased"] < min(losses["laplace"], losses["staircase"], losses["dbrr"])


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--epsilon", "0"], "epsilon"),
    (["--epsilon", "-1"], "epsilon"),
    (["--epsilon", "nan"], "epsilon"),
    (["--epsilon", "inf"], "epsilon"),
    (["--labels", "3,1,2"], "increasing"),
    (["--labels", "1,2,2"], "increasing"),
    (["--mesh", "1"], "mesh"),
    (["--prior-file", "/nonexistent.csv"], "not found"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(capsys, prior_file, extra, fragment):
    base = {"--epsilon": "1", "--labels": "1:52", "--prior-file": str(prior_file)}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        base[flag] = value
    args = ["randomizer", "solve", "--mechanism", "opt-unbiased", "--json"]
    for flag, value in base.items():
        args += [flag, value]
    code, out, err = _run(capsys, *args)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err


@pytest.mark.parametrize("content", ["label,weight\n1,-2\n", "label,weight\n1,0\n2,0\n", "a,b\n1,2\n",
                                     "label,weight\n99,1\n", "label,weight\n1,1\n1,2\n", "label,weight\n1,x\n"])
def test_bad_prior_files_are_refused(capsys, tmp_path, content):
    path = tmp_path / "p.csv"
    path.write_text(content)
    code, out, err = _run(capsys, "randomizer", "solve", "--mechanism", "rr-on-bins", "--epsilon", "1",
                          "--labels", "1:52", "--prior-file", str(path), "--json")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "prior" in err.lower() or "label" in err.lower()


def test_console_script_runs_as_a_process(prior_file):
    done = subprocess.run([sys.executable, "-m", "labeldp", "randomizer", "solve", "--mechanism", "dbrr",
                           "--epsilon", "0.5", "--labels", "1:52", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["num_outputs"] == 52
    bad = subprocess.run([sys.executable, "-m", "labeldp", "randomizer", "solve", "--mechanism", "dbrr",
                          "--epsilon", "0", "--labels", "1:52"], capture_output=True, text=True)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_continuous_solver_is_chosen_by_flag_and_at_least_as_good_as_a_mesh(capsys, prior_file):
    common = ["randomizer", "solve", "--mechanism", "opt-unbiased", "--epsilon", "1", "--labels", "1:52",
              "--prior-file", str(prior_file), "--json"]
    code, out, err = _run(capsys, *common, "--solver", "continuous")
    assert code == 0, err
    continuous = json.loads(out)
    assert continuous["solver"] == "continuous" and 0 <= continuous["optimality_gap"] <= 1e-6
    code, out, _ = _run(capsys, *common, "--solver", "mesh", "--mesh", "52")
    mesh = json.loads(out)
    assert code == 0 and mesh["solver"] == "mesh" and mesh["mesh"] == 52
    assert continuous["noisy_label_loss"] <= mesh["noisy_label_loss"]
    code, out, err = _run(capsys, *common, "--solver", "continuous", "--mesh", "52")
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1 and "mesh" in err


def test_files_the_tool_writes_are_its_users_alone(tmp_path):
    """A review found uploaded labels files readable by every local user (umask 022): every command runs with
    umask 077, so the database, the data directory and what is written under it are the service user's only."""
    env = {**os.environ, "LABELDP_DATABASE_URL": f"sqlite:///{tmp_path}/labels.db",
           "LABELDP_DATA_DIR": str(tmp_path / "data")}
    made = subprocess.run([sys.executable, "-m", "labeldp", "labels", "create-key", "--org", "o", "--role",
                           "admin"], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    written = [tmp_path / "labels.db", *(tmp_path / "data").rglob("*")]
    assert len(written) > 1
    assert all(path.stat().st_mode & 0o077 == 0 for path in written), [
        (str(path), oct(path.stat().st_mode)) for path in written if path.stat().st_mode & 0o077]
