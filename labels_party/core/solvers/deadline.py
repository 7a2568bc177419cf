"""A time limit for solvers: a solve that would run longer than the deployment allows stops with ``solver_timeout``
instead of holding a worker for minutes. In a release the solve runs on a private prior, after the charge, so a
timeout there is not a refusal: the family's fallback is built instead (:mod:`labels_party.core.registry`).

Solvers check it between their rounds and pass what is left to HiGHS (``time_limit``) and Clarabel
(``time_limit``), so an overrun is detected within one solver call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from shared.errors import ErrorCode, LabelDPError


class SolverTimeout(LabelDPError):
    code = ErrorCode.SOLVER_TIMEOUT


@dataclass(frozen=True)
class Deadline:
    seconds: float
    started: float = field(default_factory=time.monotonic)

    @property
    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def check(self, what: str = "the solver") -> None:
        if self.remaining <= 0:
            self.expired(what)

    def expired(self, what: str = "the solver"):
        """Raise the timeout (also when a solver's own time limit stopped it a moment early)."""
        raise SolverTimeout(f"{what} ran past the {self.seconds:g} s solver limit: use a smaller label domain (a "
                            "continuous domain with a coarser grid) or another mechanism")

    def solver_seconds(self) -> float | None:
        """What to pass to a solver's own time limit (None: no limit); at least a millisecond."""
        return None if math.isinf(self.seconds) else max(1e-3, self.remaining)


NO_DEADLINE = Deadline(math.inf)
