"""A release's randomizer as a bounded matrix, read from its public mechanism document (``describe()`` of the
mechanism, see :mod:`labels_party.ledger.documents`): P(output | input) for finite randomizers, inclusion probabilities
for the subset randomizer, nothing for additive noise (its support is infinite).

Wide randomizers are downsampled to at most ``MAX_CELLS`` × ``MAX_CELLS`` blocks of consecutive inputs and
outputs: a block's value is the probability that the output falls in the column block, averaged over the inputs
of the row block (so rows still sum to 1). Randomized response is never expanded to its |Y| × m matrix: its blocks
come in closed form from the two probabilities, so a 50,000-label RR-on-Bins page costs O(|Y|)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_CELLS = 48
SCALE = 2.0**53  # finite randomizers store their probabilities as integers over 2^53


@dataclass(frozen=True)
class Blocks:
    """A downsampled randomizer: ``matrix[i, j]`` for row block i and column block j, with the range of input
    and output values each axis covers and what the entries mean."""

    matrix: np.ndarray
    inputs: tuple[str, str]
    outputs: tuple[str, str]
    num_inputs: int
    num_outputs: int
    meaning: str

    @property
    def downsampled(self) -> bool:
        return self.matrix.shape != (self.num_inputs, self.num_outputs)


def _starts(size: int, cells: int) -> np.ndarray:
    """First index of each of min(size, cells) blocks of consecutive indices, sizes as even as can be (the first
    size mod blocks blocks one longer, as ``np.array_split``)."""
    count = min(size, cells)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    small, extra = divmod(size, count)
    sizes = np.full(count, small, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes)[:-1]))


def _block_of(size: int, starts: np.ndarray) -> np.ndarray:
    return np.searchsorted(starts, np.arange(size), side="right") - 1


def _label(value) -> str:
    return f"{float(value):.4g}"


def _range(values: list) -> tuple[str, str]:
    return (_label(values[0]), _label(values[-1])) if values else ("", "")


def downsample_dense(matrix: np.ndarray, cells: int = MAX_CELLS) -> np.ndarray:
    """Row blocks averaged, column blocks summed."""
    rows, cols = _starts(matrix.shape[0], cells), _starts(matrix.shape[1], cells)
    summed = np.add.reduceat(np.add.reduceat(matrix, rows, axis=0), cols, axis=1)
    sizes = np.diff(np.append(rows, matrix.shape[0]))
    return summed / sizes[:, None]


def downsample_randomized_response(keep: float, output_of_input: np.ndarray, num_outputs: int,
                                   cells: int = MAX_CELLS) -> np.ndarray:
    """Blocks of RR over ``num_outputs`` outputs (input y keeps output ``output_of_input[y]`` with probability
    ``keep``, any other output with (1 − keep)/(m − 1)), without building the matrix."""
    n = output_of_input.size
    other = (1.0 - keep) / (num_outputs - 1) if num_outputs > 1 else 0.0
    rows, cols = _starts(n, cells), _starts(num_outputs, cells)
    row_of, col_of = _block_of(n, rows), _block_of(num_outputs, cols)
    row_sizes = np.diff(np.append(rows, n)).astype(np.float64)
    col_sizes = np.diff(np.append(cols, num_outputs)).astype(np.float64)
    hits = np.zeros((rows.size, cols.size))
    np.add.at(hits, (row_of, col_of[output_of_input]), 1.0)
    return other * col_sizes[None, :] + (keep - other) * hits / row_sizes[:, None]


def downsample_top_k(keep: float, candidates: np.ndarray, num_classes: int, cells: int = MAX_CELLS) -> np.ndarray:
    """Blocks of RR-Top-k on K classes (a candidate keeps itself with probability ``keep``, moves to another
    candidate with (1 − keep)/(k − 1); any other class goes to a uniform candidate), without the K x K matrix: a
    row block R sends (keep − q)·[c ∈ R] + q·|R ∩ C| + |R − C| / k of its mass to candidate c."""
    k = candidates.size
    q = (1.0 - keep) / (k - 1) if k > 1 else 0.0
    rows, cols = _starts(num_classes, cells), _starts(num_classes, cells)
    row_of, col_of = _block_of(num_classes, rows), _block_of(num_classes, cols)
    row_sizes = np.diff(np.append(rows, num_classes)).astype(np.float64)
    inside = np.bincount(row_of[candidates], minlength=rows.size).astype(np.float64)  # |R ∩ C|
    to_candidate = (q * inside + (row_sizes - inside) / k)[:, None] + np.where(
        row_of[candidates][None, :] == np.arange(rows.size)[:, None], keep - q, 0.0)  # row blocks x candidates
    summed = np.zeros((rows.size, cols.size))
    np.add.at(summed.T, col_of[candidates], to_candidate.T)
    return summed / row_sizes[:, None]


def blocks(description: dict, cells: int = MAX_CELLS) -> Blocks | None:
    """The randomizer of one mechanism description, downsampled; None when it has no finite matrix."""
    inputs, outputs = description.get("input_values") or [], description.get("output_values") or []
    if "matrix_counts_over_2_53" in description:
        counts = np.asarray(description["matrix_counts_over_2_53"], dtype=np.float64)
        if counts.ndim != 2 or not counts.size:
            return None
        return Blocks(downsample_dense(counts / SCALE, cells), _range(inputs), _range(outputs), counts.shape[0],
                      counts.shape[1], "P(output | input)")
    if "candidates" in description and "keep_count_over_2_53" in description and inputs:
        matrix = downsample_top_k(description["keep_count_over_2_53"] / SCALE,
                                  np.asarray(description["candidates"], dtype=np.int64), len(inputs), cells)
        return Blocks(matrix, _range(inputs), _range(outputs), len(inputs), len(outputs), "P(output | input)")
    if "keep_count_over_2_53" in description and inputs:
        num_outputs = int(description.get("num_outputs") or len(outputs))
        bins = np.asarray(description.get("output_of_input", range(len(inputs))), dtype=np.int64)
        matrix = downsample_randomized_response(description["keep_count_over_2_53"] / SCALE, bins, num_outputs,
                                                cells)
        return Blocks(matrix, _range(inputs), _range(outputs), len(inputs), num_outputs, "P(output | input)")
    if "p_true" in description and "num_classes" in description:
        # class j is in the released set with probability p_true if j = y, else p_other (independently)
        k, p, q = int(description["num_classes"]), float(description["p_true"]), float(description["p_other"])
        identity = downsample_randomized_response(1.0, np.arange(k), k, cells)
        matrix = q * _block_sizes(k, cells)[None, :] + (p - q) * identity
        return Blocks(matrix, ("0", str(k - 1)), ("0", str(k - 1)), k, k,
                      "P(class is in the released set | true class); a block sums its classes")
    return None


def _block_sizes(size: int, cells: int) -> np.ndarray:
    return np.diff(np.append(_starts(size, cells), size)).astype(np.float64)


def sample_values(values: list, limit: int = 32) -> list[tuple[int, str]]:
    """At most ``limit`` (index, value) pairs, evenly spread and always including the first and last."""
    if not values:
        return []
    picks = np.unique(np.linspace(0, len(values) - 1, min(limit, len(values))).round().astype(np.int64))
    return [(int(i), _label(values[i])) for i in picks]


def summed_bars(values: list, limit: int = 64) -> np.ndarray:
    """A long count vector (a noisy prior) summed into at most ``limit`` consecutive bars."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return array
    return np.add.reduceat(array, _starts(array.size, limit))
