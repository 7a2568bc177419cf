"""ReleaseQuotas (labels_party/runtime/quotas.py) on its own, with real threads: per-organization slots and their
bounded queue, the process's capacity, the CPU bucket and its refill, and that below capacity one organization's load
changes nothing in another's answers. Runtime: about 2 s."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from labels_party.runtime.quotas import QuotaSettings, ReleaseQuotas
from shared.errors import RetryLater

A, B, C = 1, 2, 3  # organization ids


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _refused(quotas: ReleaseQuotas, org: int) -> RetryLater:
    with pytest.raises(RetryLater) as refused, quotas.slot(org):
        pass
    return refused.value


def test_an_organization_computes_at_most_its_slots_and_queues_as_many():
    quotas = ReleaseQuotas(QuotaSettings(release_slots_per_org=2, release_slots=4, release_queue_seconds=0.5))
    with ExitStack() as held:
        held.enter_context(quotas.slot(A))
        held.enter_context(quotas.slot(A))
        started = time.monotonic()
        refused = _refused(quotas, A)  # waited its 0.5 s for one of its two to finish
        assert time.monotonic() - started >= 0.45  # (a lower bound: a loaded machine only makes it wait longer)
        assert (refused.code, refused.retry_after) == ("release_quota_exceeded", 1)
        assert "2 releases being computed" in str(refused) and "nothing was charged" in str(refused)
        with quotas.slot(B):  # another organization below the capacity: admitted at once
            pass

        waiting = []  # two more of A's wait, and are refused once their wait is over
        threads = [threading.Thread(target=lambda: waiting.append(_refused(quotas, A))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [r.code for r in waiting] == ["release_quota_exceeded"] * 2


def test_a_full_queue_refuses_without_waiting():
    """Two of A's releases compute and two wait (as many as its slots, for up to 300 s); a third is refused at
    once: it returns while nothing has been freed and the two still wait — had it queued, it would still be
    waiting (not a stopwatch, which a loaded machine breaks)."""
    quotas = ReleaseQuotas(QuotaSettings(release_slots_per_org=2, release_slots=4, release_queue_seconds=300))
    got = []
    with ExitStack() as held:
        held.enter_context(quotas.slot(A))
        held.enter_context(quotas.slot(A))

        def wait_for_slot() -> None:
            with quotas.slot(A):
                got.append("slot")

        waiters = [threading.Thread(target=wait_for_slot) for _ in range(2)]
        for thread in waiters:
            thread.start()
        _until(lambda: quotas._waiting[A] == 2)
        third: list[RetryLater] = []
        refusing = threading.Thread(target=lambda: third.append(_refused(quotas, A)))
        refusing.start()
        refusing.join(120)  # a bound for a failure only: queued, it would wait 300 s
        assert not refusing.is_alive() and [r.code for r in third] == ["release_quota_exceeded"]
        assert quotas._waiting[A] == 2 and got == []  # nothing freed meanwhile: it did not wait for a slot
    for thread in waiters:  # the held slots freed: both waiting releases compute
        thread.join()
    assert got == ["slot", "slot"]


def _until(check, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the failure bound"
        time.sleep(0.01)


def test_a_waiting_release_gets_the_slot_freed_within_its_wait():
    quotas = ReleaseQuotas(QuotaSettings(release_slots_per_org=1, release_slots=4, release_queue_seconds=120))
    order = []
    first = threading.Event()

    def hold():
        with quotas.slot(A):
            first.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=hold)
    thread.start()
    first.wait()
    started = time.monotonic()
    with quotas.slot(A):
        order.append("second started")
    thread.join()
    assert order == ["first done", "second started"]  # admitted, not refused: it waited for the freed slot
    assert time.monotonic() - started >= 0.2


def test_the_capacity_is_the_one_place_other_organizations_show():
    quotas = ReleaseQuotas(QuotaSettings(release_slots_per_org=2, release_slots=3, release_queue_seconds=0.2))
    with ExitStack() as held:
        held.enter_context(quotas.slot(A))
        held.enter_context(quotas.slot(A))
        held.enter_context(quotas.slot(B))  # all three slots taken: C has used nothing, yet it must wait
        refused = _refused(quotas, C)
        assert (refused.code, refused.retry_after) == ("release_capacity_exhausted", 1)
        assert "maximum of 3 releases" in str(refused)
        # B is below its own limit too: it meets the capacity, not a quota of its own.
        assert _refused(quotas, B).code == "release_capacity_exhausted"
        assert _refused(quotas, A).code == "release_quota_exceeded"  # A meets its own limit first
    with quotas.slot(C):
        pass


def test_time_in_a_slot_is_debited_after_each_release_and_refills_over_the_window():
    """The debit is the wall-clock time a release held its slot (what its requester sees as its response time),
    not its CPU time (labels_party/runtime/quotas.py: a quantile's CPU time depends on the labels)."""
    clock = _Clock()
    quotas = ReleaseQuotas(QuotaSettings(release_seconds=10, release_window_seconds=100), clock=clock)
    with quotas.slot(A):
        clock.now += 4  # a release held its slot four seconds (sleeping or computing: the same)
    assert quotas.balance(A) == pytest.approx(6)  # the bucket was full: no refill beyond it meanwhile
    with quotas.slot(A), quotas.slot(A):  # admitted while the bucket is not empty: it can go below zero
        clock.now += 5
    # Two releases held a slot 5 s each, and 0.1 s per second refilled meanwhile: 6 + 0.5 − 10.
    assert quotas.balance(A) == pytest.approx(-3.5)
    assert quotas.balance(B) == pytest.approx(10)  # another organization's bucket is untouched
    refused = _refused(quotas, A)
    # Refilled at 0.1 s per second: no longer empty in 3.5 / 0.1 = 35 s.
    assert (refused.code, refused.retry_after) == ("release_quota_exceeded", 35)
    assert "10 seconds of release computation per 100 s" in str(refused)
    with quotas.slot(B):  # B is admitted meanwhile
        pass
    clock.now += 30
    assert _refused(quotas, A).retry_after == 5
    clock.now += 5.5
    with quotas.slot(A):
        pass
    clock.now = 1000
    assert quotas.balance(A) == pytest.approx(10)  # never beyond the bucket


def test_idle_organizations_are_forgotten():
    clock = _Clock()
    quotas = ReleaseQuotas(QuotaSettings(release_seconds=10, release_window_seconds=1e6), clock=clock)
    for org in range(1000):
        with quotas.slot(org):
            clock.now += 0.001  # each held its slot 1 ms, which 10⁻⁵ s per second refills in 100 s
    assert len(quotas._buckets) == 1000
    clock.now += 100  # refilled: each organization's bucket is full again
    with quotas.slot(A):
        pass
    assert len(quotas._buckets) == 0


@pytest.mark.parametrize("old, new", [("LABELDP_RELEASE_CPU_SECONDS", "LABELDP_RELEASE_SECONDS"),
                                      ("LABELDP_RELEASE_CPU_WINDOW_SECONDS", "LABELDP_RELEASE_WINDOW_SECONDS")])
def test_a_renamed_quota_variable_is_refused_not_ignored(monkeypatch, capsys, old, new):
    """A deployment that tightened the quota under the old name would silently run at the default."""
    from labeldp.cli import main
    from labels_party.runtime.settings import LabelsSettings

    monkeypatch.setenv(old, "5")
    with pytest.raises(ValueError, match=f"{old} is now {new}"):
        LabelsSettings()
    assert main(["labels", "serve", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{old} is now {new}" in err[0]
