"""Thin helper around highspy: pass a column-wise LP, solve it, return primal values (and duals)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from labels_party.core.solvers.deadline import SolverTimeout
from shared.errors import ErrorCode, LabelDPError


class _SilentCore(highspy._core._Highs):
    def setCallback(self, *args):
        self.setOptionValue("output_flag", False)  # before the first call that logs
        return super().setCallback(*args)


class _SilentHighs(highspy.Highs, _SilentCore):
    """highspy's solver with its output off from the start. ``Highs()`` registers its callbacks in its constructor
    (``super().setCallback``), a HiGHS call that writes the banner ("Running HiGHS 1.16.0 ...") to file
    descriptor 1 while output_flag still has its default, true — before any caller can turn it off, and in the
    middle of a ``--json`` document on stdout. In this class's method order that ``super()`` is
    :class:`_SilentCore`, which turns the output off first."""


def quiet_highs() -> highspy.Highs:
    """A HiGHS solver that never writes to stdout (every solver of this package is made here)."""
    return _SilentHighs()


@dataclass(frozen=True)
class LPResult:
    x: np.ndarray
    row_duals: np.ndarray
    objective: float
    seconds: float


def solve_lp(cost, col_lower, col_upper, row_lower, row_upper, starts, indices, values, *,
             tolerance: float = 1e-9, solver: str = "choose", time_limit: float | None = None) -> LPResult:
    """Minimize cost·x subject to row_lower <= A x <= row_upper, col_lower <= x <= col_upper (A column-wise)."""
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = len(cost)
    lp.num_row_ = len(row_lower)
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(col_lower, dtype=np.float64)
    lp.col_upper_ = np.where(np.isinf(col_upper), inf, col_upper).astype(np.float64)
    lp.row_lower_ = np.where(np.isinf(row_lower), -inf, row_lower).astype(np.float64)
    lp.row_upper_ = np.where(np.isinf(row_upper), inf, row_upper).astype(np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(indices, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(values, dtype=np.float64)
    highs = quiet_highs()
    highs.setOptionValue("primal_feasibility_tolerance", tolerance)
    highs.setOptionValue("dual_feasibility_tolerance", tolerance)
    highs.setOptionValue("solver", solver)
    if time_limit is not None:
        highs.setOptionValue("time_limit", float(time_limit))
    highs.passModel(lp)
    started = time.perf_counter()
    highs.run()
    seconds = time.perf_counter() - started
    status = highs.getModelStatus()
    if status == highspy.HighsModelStatus.kTimeLimit:
        raise SolverTimeout(f"HiGHS ran past its {time_limit:g} s time limit: use a smaller label domain or mesh, or "
                            "another mechanism")
    if status != highspy.HighsModelStatus.kOptimal:
        raise LabelDPError(f"HiGHS did not reach an optimal solution: {highs.modelStatusToString(status)}",
                           code=ErrorCode.SOLVER_FAILED)
    solution = highs.getSolution()
    return LPResult(np.array(solution.col_value), np.array(solution.row_dual),
                    float(highs.getInfo().objective_function_value), seconds)
