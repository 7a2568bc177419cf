"""The privacy ledger, the one place that reads and writes budgets, charges and their records.

**Budgets and accounts.** A dataset has a per-example budget (ε_total in exact integer units of 10⁻⁹, and δ_total).
It is divided into *accounts*, one per organization that may release: the owner's and one per grant, each with an
allocation (ε units, δ) set by the owner (:mod:`labels_party.ledger.budgets`: allocations never sum beyond the dataset's
budget). An account's admission depends on its own spending only, so a refusal — or its absence — tells an
organization nothing about another's use; and every example's total over accounts stays within the dataset's
(ε_total, δ_total) by basic composition.

**Charges** (:class:`Charge`) are fixed before anything private is drawn (:mod:`labels_party.releases.transaction`).
Pure ε-DP events add their exact units per example. Events with δ > 0 — DP-SGD's subsampled Gaussian, the only
ones the service runs — add their Rényi-DP curve (dp-accounting's RDP accountant, at :data:`RDP_ORDERS`,
quantized *up* to units so that sums are exact integers); an example's spent ε in an account is its pure units
plus the ε of its summed curve at the account's δ (rounded up): the Gaussian events compose under RDP — many
central trainings cost what the accountant says, not the sum of their ε — and compose with the pure events by
basic composition.

**Records.** Each charge appends one :class:`LedgerRecord` (a frozen value built here, in one place): who, what
was requested, the charged ``dp_event`` (from which :func:`shared.mechanisms.events.epsilon_of` recomputes ε),
the charge (units, RDP curve), the account's allocation, the covered examples (count, SHA-256 and a coverage file
or range) and, through the hash chain, every record before it.

**State.** Per account, the spent state is kept as coverage classes (:class:`AccountState`): one int32 class id per
example and one row per class — (pure units, size) and the RDP curve when the account ran Gaussian events — so
it does not grow with releases × examples; every pass over it goes block by block (:data:`CHUNK`). The state can
always be rebuilt from the records alone (:meth:`Ledger.rebuild`, which :func:`verify` compares with it).

**Chain.** Besides charges, the chain records every budget-relevant fact — totals, grants, allocations, keys
(:mod:`.chain`) — and its head is signed and exported after every commit (:mod:`.signing`), so that an outsider
who pinned a head can prove the database was not rewritten or truncated since (``verify-audit --pinned``).

**Anchor.** Inside each transaction that appends to a chain (a charge or a fact), just before it commits, the
data directory gets the dataset's new chain head and the one before it (:class:`Anchor`). A database restored from
a backup older than the data directory is behind its anchor; a data directory without the anchor of a dataset that
has records is not this database's: the service refuses to start, and to charge, rather than re-draw releases it
already delivered (``docs/design/exact-ledger.md``, "Restoring").

The package's modules: :mod:`.units` (exact units, remaining budget), :mod:`.charges` (what an event costs),
:mod:`.records` (the record, the facts, their reader), :mod:`.chain` (appending, after-commit export),
:mod:`.signing` (signed heads), :mod:`.books` (the accounts' state, the charge, the anchor,
the recomputation). Everything else imports from ``labels_party.ledger``.
"""

from labels_party.ledger.agreement import LedgerTampered, tampered
from labels_party.ledger.books import (
    CHUNK,
    AccountState,
    Anchor,
    BudgetExceeded,
    Ledger,
    LedgerRollback,
    recorded_coverage,
    rollback_message,
)
from labels_party.ledger.chain import Replayed, replay
from labels_party.ledger.charges import (
    Charge,
    charged_units,
    is_gaussian,
    rdp_curve,
    rdp_epsilon_units,
)
from labels_party.ledger.records import (
    UNNAMED,
    Actor,
    AllocationFact,
    BudgetFact,
    Charged,
    Entry,
    GrantFact,
    KeyFact,
    LedgerRecord,
    RecordFields,
    RecordSummary,
    ReleaseFact,
    canonical,
    chain_hash,
    chain_intact,
    entries,
    is_release,
    read_fact,
    records_by_org,
    verify_chain,
)
from labels_party.ledger.signing import HeadSigner, SignedHead, load_key_file
from labels_party.ledger.units import (
    UNITS_PER_EPSILON,
    budget_figures,
    budget_units,
    charge_units,
    legacy_units,
    remaining_units,
    units_epsilon,
    within_charge,
)

__all__ = [
    "AccountState", "AllocationFact", "BudgetFact", "GrantFact", "HeadSigner", "KeyFact", "LedgerTampered",
    "ReleaseFact", "Replayed", "SignedHead",
    "is_release", "load_key_file", "tampered", "read_fact", "replay",
    "CHUNK", "RDP_ORDERS", "UNITS_PER_EPSILON", "UNNAMED", "Actor", "Anchor", "BudgetExceeded", "Charge", "Charged",
    "Entry", "Ledger", "LedgerRecord", "LedgerRollback", "RecordFields", "RecordSummary", "budget_figures",
    "budget_units", "canonical", "chain_hash", "chain_intact", "charge_units", "charged_units", "entries",
    "is_gaussian", "legacy_units", "rdp_curve", "rdp_epsilon_units", "recorded_coverage", "records_by_org",
    "remaining_units", "rollback_message",
    "units_epsilon", "verify_chain", "within_charge",
]


def __getattr__(name: str):  # RDP_ORDERS from dp-accounting, imported when first read (labels_party.ledger.charges)
    if name == "RDP_ORDERS":
        from labels_party.ledger.charges import rdp_orders

        return rdp_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
