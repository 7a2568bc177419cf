"""bench/auto_evidence.py, run as people run it: auto against the constant (every seed) and the best fixed choice
(on average), from bench utility runs — with a rerun of auto superseding the earlier one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runs(auto: dict[int, float], fixed: dict[tuple[str, str], list[float]], constant: list[float]) -> pd.DataFrame:
    rows = [{"dataset": "t", "model": "mlp", "mechanism": "non-private", "epsilon": None, "seed": seed,
             "constant_test_loss": c, "test_loss": 1.0} for seed, c in enumerate(constant)]
    rows += [{"dataset": "t", "model": model, "mechanism": mechanism, "epsilon": 1.0, "seed": seed, "test_loss": loss}
             for (mechanism, model), losses in fixed.items() for seed, loss in enumerate(losses)]
    rows += [{"dataset": "t", "model": "auto", "mechanism": "auto", "epsilon": 1.0, "seed": seed, "test_loss": loss,
              "auto_choice": "constant"} for seed, loss in auto.items()]
    return pd.DataFrame(rows)


def _evidence(tmp_path: Path, *frames: pd.DataFrame) -> dict:
    dirs = []
    for index, frame in enumerate(frames):
        (tmp_path / str(index)).mkdir(parents=True)
        frame.to_csv(tmp_path / str(index) / "runs.csv", index=False)
        dirs.append(str(tmp_path / str(index)))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "auto_evidence.py"), "--runs", *dirs,
                           "--out", str(tmp_path / "out"), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "evidence.png").read_bytes()[:4] == b"\x89PNG"
    return json.loads(done.stdout)


def test_worst_seed_and_best_fixed_and_a_rerun_of_auto_replaces_the_first(tmp_path):
    fixed = {("rr-on-bins", "mlp"): [12.0, 11.0], ("opt-unbiased", "gbdt"): [9.0, 11.0]}
    first = _runs({0: 10.0, 1: 11.5}, fixed, constant=[10.0, 10.0])  # seed 1: 1.15 × the constant
    rerun = _runs({0: 9.5, 1: 10.1}, {}, constant=[10.0, 10.0])
    before = _evidence(tmp_path / "a", first)
    assert before["summary"]["worst_seed_ratio_to_constant"] == pytest.approx(1.15)
    assert before["summary"]["within_bound_every_seed"] is False
    assert before["cells"][0]["best_fixed"] == "opt-unbiased (gbdt)"  # mean 10 against 11.5
    assert before["cells"][0]["ratio_to_best_fixed"] == pytest.approx(10.75 / 10.0)
    after = _evidence(tmp_path / "b", first, rerun)
    cell = after["cells"][0]
    assert cell["seeds"] == 2 and cell["auto"] == pytest.approx(9.8)  # the rerun's two seeds only
    assert after["summary"]["worst_seed_ratio_to_constant"] == pytest.approx(1.01)
    assert after["summary"]["within_bound_every_seed"] is True
    assert cell["best_fixed"] == "opt-unbiased (gbdt)"  # the first directory's fixed runs still count


def test_a_cell_without_fixed_runs_still_holds_auto_to_the_constant(tmp_path):
    """An ε with auto and the non-private reference only (no fixed mechanism run there): its worst seed still
    counts against the bound; the mean gap is over the cells that have fixed runs."""
    at_one = _runs({0: 10.0, 1: 10.1}, {("rr-on-bins", "mlp"): [10.5, 10.5]}, constant=[10.0, 10.0])
    at_two = _runs({0: 10.0, 1: 10.5}, {}, constant=[10.0, 10.0]).assign(
        epsilon=lambda f: f["epsilon"].where(f["epsilon"].isna(), 2.0))
    found = _evidence(tmp_path, pd.concat([at_one, at_two[at_two.mechanism == "auto"]], ignore_index=True))
    cells = {cell["epsilon"]: cell for cell in found["cells"]}
    assert cells[2.0]["best_fixed"] is None and cells[2.0]["ratio_to_best_fixed"] is None
    assert found["summary"]["worst_seed_ratio_to_constant"] == pytest.approx(1.05)  # ε = 2's seed 1
    assert found["summary"]["within_bound_every_seed"] is False
    assert found["summary"]["cells_with_fixed_runs"] == 1
    assert found["summary"]["mean_ratio_to_best_fixed"] == pytest.approx(10.05 / 10.5)
