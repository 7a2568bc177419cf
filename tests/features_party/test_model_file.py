"""An MLP model file is input (features_party/learn/model_file.py): ``labeldp predict`` reads it from wherever the user
keeps it. A real job-shaped file round-trips; each of the review's hostile files — a small file describing a huge
network, weights of the wrong shape, a header of nested brackets, strings where numbers belong, a padded
vocabulary, an extra member, a member larger decompressed than the whole file may be — is one ``malformed_file``
error, and none of them allocates what it describes."""

from __future__ import annotations

import io
import json
import resource
import zipfile
from pathlib import Path

import numpy as np
import pytest

from features_party.features import Preprocessor
from features_party.learn.model_file import load_model
from features_party.learn.train import TrainConfig, save_model, train
from labeldp.cli import main as cli
from shared.errors import LabelDPError

PREPROCESSING = Preprocessor(("a", "b"), ("g",), (0.0, 1.0), (1.0, 2.0), (("x", "y", "z"),)).to_dict()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    rng = np.random.default_rng(5)
    numeric = rng.normal(size=(200, 2)).astype(np.float32)
    categorical = rng.integers(0, 4, size=(200, 1)).astype(np.int32)
    y = numeric[:, 0] + categorical[:, 0] + rng.normal(0, 0.1, 200)
    config = TrainConfig(hidden=(4,), embed_dim=2, batch_size=64, epochs=2)
    result = train(config, numeric, categorical, y, vocab_sizes=(4,))
    path = tmp_path_factory.mktemp("model") / "model.npz"
    save_model(path, result, PREPROCESSING, extra={"mechanism": "laplace"})
    return path


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _header(path: Path) -> dict:
    return json.loads(str(np.lib.format.read_array(io.BytesIO(_members(path)["header.npy"]))))


def _with_header(model: Path, target: Path, edit) -> Path:
    header = _header(model)
    edit(header)
    return _write(target, {**_members(model), "header.npy": _npy(np.array(json.dumps(header)))})


def test_a_job_shaped_file_round_trips(model):
    result, header = load_model(model)
    assert header["mechanism"] == "laplace" and header["preprocessing"] == PREPROCESSING
    assert result.spec.vocab_sizes == (4,) and result.spec.hidden == (4,)


def _huge_spec(h: dict) -> None:
    h["spec"]["hidden"] = [4096] * 8  # ~117 M parameters for a file of a few KB
    h["config"]["hidden"] = [4096] * 8


EDITS = {
    "a huge network in a small file": _huge_spec,
    "a spec beyond the parameter cap": lambda h: h["spec"].update(num_numeric=1000, hidden=[4096] * 8),
    "hidden sizes that are not the weights'": lambda h: h["spec"].update(hidden=[5]),
    "strings as means": lambda h: h["preprocessing"].update(means=["0", "1"]),
    "a non-finite scale": lambda h: h.update(target_scale=float("inf")),
    "a negative scale": lambda h: h.update(target_scale=-1.0),
    "a vocabulary padded with duplicates": lambda h: h["preprocessing"].update(vocabularies=[["x", "x", "z"]]),
    "a vocabulary not the network's": lambda h: h["preprocessing"].update(vocabularies=[["x"]]),
    "an unknown loss": lambda h: h["config"].update(loss="hinge"),
    "a loss that does not fit one output": lambda h: h["config"].update(loss="cross_entropy"),
    "a string as the learning rate": lambda h: h["config"].update(learning_rate="0.01"),
    "a missing field": lambda h: h.pop("spec"),
    "a history that is not a list": lambda h: h.update(history="x"),
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_each_hostile_header_is_one_malformed_file_error(model, tmp_path, edit):
    path = _with_header(model, tmp_path / "m.npz", EDITS[edit])
    with pytest.raises(LabelDPError) as caught:
        load_model(path)
    assert caught.value.code == "malformed_file" and str(tmp_path) not in str(caught.value)


def test_a_bracket_bomb_header_is_malformed(model, tmp_path):
    bomb = np.array("[" * 100_000 + "]" * 100_000)
    path = _write(tmp_path / "m.npz", {**_members(model), "header.npy": _npy(bomb)})
    with pytest.raises(LabelDPError, match="not a labeldp job's MLP"):
        load_model(path)


def test_weights_of_the_wrong_shape_or_kind_are_malformed(model, tmp_path):
    members = _members(model)
    first = np.lib.format.read_array(io.BytesIO(members["leaf_0000.npy"]))
    for leaf in (np.zeros(first.shape + (2,), np.float32), first.astype(np.float64),
                 np.full(first.shape, np.nan, np.float32)):
        path = _write(tmp_path / "m.npz", {**members, "leaf_0000.npy": _npy(leaf)})
        with pytest.raises(LabelDPError, match="not a labeldp job's MLP"):
            load_model(path)


def test_extra_or_missing_members_are_malformed(model, tmp_path):
    members = _members(model)
    for changed in ({**members, "extra.npy": _npy(np.zeros(1))},
                    {k: v for k, v in members.items() if k != "leaf_0001.npy"},
                    {k: v for k, v in members.items() if k != "header.npy"}):
        with pytest.raises(LabelDPError, match="not a labeldp job's MLP"):
            load_model(_write(tmp_path / "m.npz", changed))


def test_a_decompression_bomb_is_refused_before_it_is_inflated(model, tmp_path):
    """A 2 GB zero leaf deflates to ~2 MB; its declared size is refused, and the process's peak memory shows it was
    never inflated."""
    members = _members(model)
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            if name != "leaf_0000.npy":
                archive.writestr(name, data)
        with archive.open("leaf_0000.npy", "w", force_zip64=True) as handle:  # the real leaf, then 2 GB of zeros
            handle.write(members["leaf_0000.npy"])
            chunk = bytes(1 << 24)
            for _ in range(128):
                handle.write(chunk)
    assert bomb.stat().st_size < 10 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(LabelDPError, match="not a labeldp job's MLP"):
        load_model(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: far below 2 GB


def test_a_file_over_the_size_cap_is_refused_by_its_size(model, tmp_path):
    with pytest.raises(LabelDPError, match="more than 1,000"):
        load_model(model, max_bytes=1000)


def test_predict_on_a_damaged_file_is_one_line_and_no_traceback(model, tmp_path, capsys):
    path = _with_header(model, tmp_path / "m.npz", _huge_spec)
    table = tmp_path / "rows.csv"
    table.write_text("example_id,a,b,g\ne1,0.5,1.0,x\n")
    code = cli(["predict", "--model", str(path), "--features", str(table), "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "malformed" in err or "not a labeldp job's MLP" in err
