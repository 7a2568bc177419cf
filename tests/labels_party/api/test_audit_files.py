"""Issue 40, the thirty-ninth hostile review: files and rows a database or data-directory writer changed so that the
same examples were charged once and released twice — a label version hidden from the registry an upload numbers
new ids against (its row deleted or its range emptied: the next upload registered the same ids again, and
verify-audit said valid), a version's coverage file narrowed to one index (five full releases on an allocation of
one), an account's class file emptied (every example fresh again) — or that took a charge and verify-audit to
gigabytes (a sparse coverage file of 2²⁸ entries), and revocation files that made every request a 500 or scan
50,000 files. Each is now refused with 503 ``ledger_tampered`` before anything is charged, read whole or served.
~15 s on SQLite."""

from __future__ import annotations

import resource

import numpy as np
import pytest
from sqlalchemy import select, text

from labels_party.ledger import revocations
from labels_party.store import db
from tests.labels_party.api import test_audit_chain as chain_tests
from tests.labels_party.api.helpers import created, expect_error, labels_csv, release, upload
from tests.labels_party.api.test_audit_chain import _sql

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
audit_key, ctx = chain_tests.audit_key, chain_tests.ctx


def _tampered(response, says: str = "") -> None:
    expect_error(response, 503, "ledger_tampered")
    assert says in response.json()["error"]["message"], response.text


def _seq(ctx, dataset: str) -> int:
    with ctx.sessions() as s:
        return s.get(db.Dataset, dataset).ledger_seq


def _hide_first_version(ctx, dataset: str, how: str) -> None:
    if how == "delete":
        _sql(ctx, "DELETE FROM label_versions WHERE dataset_id = :d AND version = 1", d=dataset)
    else:
        column, other = ("registry_start", "registry_end") if how == "start" else ("registry_end", "registry_start")
        _sql(ctx, f"UPDATE label_versions SET {column} = {other} WHERE dataset_id = :d AND version = 1", d=dataset)


@pytest.mark.parametrize("how", ["start", "end", "delete"])
def test_a_version_hidden_from_the_registry_registers_no_id_again(ctx, client, admin, consumer, dataset, labels,
                                                                  how):
    """The review's H1: the consumer spent its ε = 3 on version 1's 2,000 ids; a second version registered 1,000
    others; version 1 hidden, the owner's upload of its ids registered them again at 3000–4999 (fresh budgets), and
    a second ε = 3 release of them was served. The registry is read from the chain's label facts: refused."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3))
    assert upload(client, admin, dataset, labels_csv({f"f{i}": 7 for i in range(1000)})).status_code == 200
    with ctx.sessions() as s:
        registry, seq = s.get(db.Dataset, dataset).registry_size, s.get(db.Dataset, dataset).ledger_seq
    assert registry == 3000
    _hide_first_version(ctx, dataset, how)
    _tampered(upload(client, admin, dataset, labels_csv(labels)), says="label version 1")
    with ctx.sessions() as s:
        assert (s.get(db.Dataset, dataset).registry_size, s.get(db.Dataset, dataset).ledger_seq) == (registry, seq)


def test_a_registry_file_renamed_while_an_upload_reads_it_registers_no_id_again(ctx, client, admin, consumer,
                                                                                  dataset, labels, monkeypatch):
    """A registry file is checked, then read by DuckDB by its name: another file renamed over it for the read (and
    the checked one renamed back) would have made the upload register its ids again. The files' status when they
    were checked must be theirs when the upload commits."""
    import os

    from labels_party.store import labelstore

    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3))
    assert upload(client, admin, dataset, labels_csv({f"f{i}": 7 for i in range(1000)})).status_code == 200
    with ctx.sessions() as s:
        files = dict(s.execute(select(db.LabelVersion.version, db.LabelVersion.file).where(
            db.LabelVersion.dataset_id == dataset)).all())
        seq = s.get(db.Dataset, dataset).ledger_seq
    first, other = ctx.store.path(files[1]), ctx.store.path(files[2])
    ingest = labelstore.ingest

    def read_from_a_renamed_file(*args, **kwargs):
        kept = first.with_name("kept")
        os.replace(first, kept)
        first.write_bytes(other.read_bytes())  # the registry without the first version's ids, for the read
        try:
            return ingest(*args, **kwargs)
        finally:
            os.replace(kept, first)  # and the checked file back

    monkeypatch.setattr(labelstore, "ingest", read_from_a_renamed_file)
    _tampered(upload(client, admin, dataset, labels_csv(labels)), says="changed while the upload read it")
    assert _seq(ctx, dataset) == seq


def _version_coverage(ctx, dataset: str) -> str:
    with ctx.sessions() as s:
        return s.scalar(select(db.LabelVersion.coverage_file).where(db.LabelVersion.dataset_id == dataset))


def test_a_coverage_file_narrowed_in_the_data_directory_is_charged_never(ctx, client, consumer, dataset):
    """The review's H2: the version's coverage file overwritten with one index before each release; five ε = 3
    releases on an allocation of 3 were served, 1,995 examples never charged. Read only as the chain records it."""
    path = ctx.store.path(_version_coverage(ctx, dataset))
    indices = np.load(path)
    assert indices.size == 2000
    np.save(path, indices[:1])
    seq = _seq(ctx, dataset)
    _tampered(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3), says="chain records")
    assert _seq(ctx, dataset) == seq
    np.save(path, indices)  # put back: the honest release goes through, once
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=3))
    expect_error(release(client, consumer, dataset, "c", mechanism="rr", epsilon=3), 409, "budget_exceeded")


def _sparse_npy(path, entries: int) -> None:
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<i8", "fortran_order": False, "shape": (entries,)})
        handle.truncate(handle.tell() + 8 * entries)


def test_a_sparse_coverage_file_is_refused_unread_by_a_charge_and_by_verify(ctx, client, consumer, dataset, tmp_path,
                                                                            audit_key):
    """The review's H4 and M1: a sparse coverage file of 2²⁸ entries (2 GiB apparent) took a charge 10.9 s and
    +4.1 GB, then a 500, and verify-audit 16.5 s and +6.1 GB. Its size is not the chain's: refused unread."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    _sparse_npy(ctx.store.path(_version_coverage(ctx, dataset)), 1 << 28)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _tampered(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5), says="chain records")
    report = chain_tests._verify_log(ctx, tmp_path, audit_key)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB: nothing read whole
    assert report["valid"] is False
    assert any("coverage file" in p and "not the indices its record hashes" in p
               for p in chain_tests._problems(report))


@pytest.mark.parametrize("rewrite", ["empty", "half", "permuted"])
def test_a_class_file_rewritten_hands_out_no_budget_again(ctx, client, consumer, dataset, rewrite):
    """The review's H3: an account's class file (which example is in which class) was not on the chain; emptied,
    every example was fresh and a second ε = 3 release was served. Its entries' count and SHA-256 are recorded in
    the charge's spent state and checked before it is read."""
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=1.5))
    created(release(client, consumer, dataset, "subset", mechanism="rr", epsilon=1.5,
                    example_ids=[f"e{i}" for i in range(100)]))  # two classes: spent 3 and 1.5
    with ctx.sessions() as s:
        file = s.scalars(select(db.BudgetAccount.classes_file).where(
            db.BudgetAccount.dataset_id == dataset, db.BudgetAccount.classes_file.is_not(None))).one()
    classes = np.load(ctx.store.path(file))
    assert set(np.unique(classes).tolist()) == {0, 1}
    changed = {"empty": classes[:0], "half": classes[:1000],
               "permuted": np.roll(classes, 100)}[rewrite]  # the spent class moved onto examples never charged twice
    np.save(ctx.store.path(file), changed.astype(np.int32))
    seq = _seq(ctx, dataset)
    _tampered(release(client, consumer, dataset, "b", mechanism="rr", epsilon=1.5,
                      example_ids=[f"e{i}" for i in range(100)]), says="spent state")
    assert _seq(ctx, dataset) == seq


def test_an_account_charged_before_class_files_were_chained_records_them_at_its_next_charge(ctx, client, consumer,
                                                                                           dataset, monkeypatch):
    """A spent state from before the review names no class file's entries: the account's next charge writes the
    file again — even one that covers every class whole, which otherwise keeps it — and records them; from then on
    a rewrite is refused."""
    from labels_party.ledger import books

    legacy = books.SpentState
    monkeypatch.setattr(books, "SpentState", lambda **fields: legacy(
        **{k: v for k, v in fields.items() if not k.startswith("classes_") or k == "classes_file"}))
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.5))
    monkeypatch.setattr(books, "SpentState", legacy)
    records = _release_records(ctx, dataset)
    assert '"classes_sha256":null' in records[0]
    created(release(client, consumer, dataset, "b", mechanism="rr", epsilon=0.5))  # every class covered whole
    records = _release_records(ctx, dataset)
    assert '"classes_entries":2000' in records[1] and '"classes_sha256":"' in records[1]
    with ctx.sessions() as s:
        file = s.scalars(select(db.BudgetAccount.classes_file).where(
            db.BudgetAccount.dataset_id == dataset, db.BudgetAccount.classes_file.is_not(None))).one()
    np.save(ctx.store.path(file), np.zeros(0, np.int32))
    _tampered(release(client, consumer, dataset, "c", mechanism="rr", epsilon=0.5), says="spent state")


def _release_records(ctx, dataset: str) -> list[str]:
    with ctx.sessions() as s:
        return [r for r in s.scalars(text("SELECT record FROM ledger WHERE dataset_id = :d ORDER BY seq")
                                     .bindparams(d=dataset)) if '"event":"label_release"' in r]


def test_a_coverage_file_written_in_place_after_its_check_changes_no_charge(ctx, client, admin, consumer, dataset,
                                                                              monkeypatch):
    """The fortieth review's H1: the file was checked, then mapped; written in place between the check and the
    charge's read (the window lasts seconds at 10⁸ examples), three ε = 3 releases of a second version's 1,000 labels
    were charged to the first version's examples. A charge reads a private copy made while the file is hashed."""
    from labels_party.ledger import books
    from labels_party.store.storage import npy_header

    assert upload(client, admin, dataset, labels_csv({f"f{i}": 7 for i in range(1000)})).status_code == 200
    checked, honest = books.read_coverage, {}

    def written_after_the_check(store, name, *args, **kwargs):
        covered = checked(store, name, *args, **kwargs)
        if "coverage/" in name:  # the first version's examples written over the file, at once
            honest[name] = store.path(name).read_bytes()
            with open(store.path(name), "r+b") as handle:
                handle.seek(len(npy_header(np.int64, covered.size)))
                handle.write(np.arange(covered.size, dtype=np.int64).tobytes())
        return covered

    monkeypatch.setattr(books, "read_coverage", written_after_the_check)
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3))
    monkeypatch.setattr(books, "read_coverage", checked)
    [(name, content)] = honest.items()
    ctx.store.path(name).write_bytes(content)  # put back: the next release finds the second version charged
    expect_error(release(client, consumer, dataset, "b", mechanism="rr", epsilon=3), 409, "budget_exceeded")


def test_a_class_file_from_before_its_hash_was_recorded_is_checked_against_the_records(ctx, client, consumer,
                                                                                       dataset, monkeypatch):
    """The fortieth review's H2: an account whose last charge recorded no class-file hash read its class file
    unchecked at its next charge; emptied, a second ε = 3 release was served. Such a file is compared with what
    the chain's records imply, example by example, before the charge."""
    from labels_party.ledger import books

    legacy = books.SpentState
    monkeypatch.setattr(books, "SpentState", lambda **fields: legacy(
        **{k: v for k, v in fields.items() if not k.startswith("classes_") or k == "classes_file"}))
    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3))
    monkeypatch.setattr(books, "SpentState", legacy)
    with ctx.sessions() as s:
        file = s.scalars(select(db.BudgetAccount.classes_file).where(
            db.BudgetAccount.dataset_id == dataset, db.BudgetAccount.classes_file.is_not(None))).one()
    np.save(ctx.store.path(file), np.zeros(0, np.int32))
    seq = _seq(ctx, dataset)
    _tampered(release(client, consumer, dataset, "b", mechanism="rr", epsilon=3),
              says="per-example spent units differ from the records")
    assert _seq(ctx, dataset) == seq


def test_a_label_file_swapped_after_the_charge_draws_nothing(ctx, client, admin, consumer, dataset, monkeypatch):
    """The forty-first review's H1: a release re-opened its version's file by name after the charge; another
    version's file renamed over it there, its 2,000 examples — whose budget was spent — were drawn again (ε = 6 on a
    total of 3) and verify said valid. A pass over the version must read the examples its charge covered."""
    from labels_party.store import labelstore

    created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=3))
    assert upload(client, admin, dataset, labels_csv({f"f{i}": 7 for i in range(2000)})).status_code == 200
    with ctx.sessions() as s:
        files = dict(s.execute(select(db.LabelVersion.version, db.LabelVersion.file).where(
            db.LabelVersion.dataset_id == dataset)).all())
    charged, spent = ctx.store.path(files[2]), ctx.store.path(files[1]).read_bytes()
    honest, opened = charged.read_bytes(), labelstore.iter_version

    def swapped_after_the_charge(store, file, *args):
        charged.write_bytes(spent)  # the first version's rows where the second's were
        return opened(store, file, *args)

    monkeypatch.setattr(labelstore, "iter_version", swapped_after_the_charge)
    refused = release(client, consumer, dataset, "b", mechanism="rr", epsilon=3)
    monkeypatch.setattr(labelstore, "iter_version", opened)
    charged.write_bytes(honest)
    expect_error(refused, 503, "release_failed")  # charged, failed, nothing served (the log says why)
    with ctx.sessions() as s:
        assert sorted(s.scalars(select(db.Release.state).where(db.Release.dataset_id == dataset))) == \
            ["available", "failed"]


def _hooked_download(monkeypatch, move):
    """The release's file checked, then ``move`` (a data-directory writer's, timed by the test) before anything is
    read from it."""
    from labels_party.releases import queries

    opened = queries.opened_labels

    def then_moved(*args, **kwargs):
        table = opened(*args, **kwargs)
        move()
        return table

    monkeypatch.setattr(queries, "opened_labels", then_moved)


@pytest.mark.parametrize("swap", ["label file linked in", "link to /etc/hostname", "sparse GiB", "fifo"])
def test_a_release_file_swapped_after_its_check_is_never_what_a_download_serves(ctx, client, consumer, dataset,
                                                                               monkeypatch, swap):
    """The forty-second review: a download checked the release's file, then opened it again by name — a rename of
    the dataset's label file over it there served the true labels (139 of 1,726 downloads, no hook needed), a link
    to /dev/zero an endless stream, a FIFO hung a worker. What is served is read from the descriptors checked."""
    import os

    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.1))
    honest = client.get(f"/v1/releases/{made['id']}/labels", headers=consumer).content
    with ctx.sessions() as s:
        target = ctx.store.path(s.get(db.Release, made["id"]).file)
        version = ctx.store.path(s.scalars(select(db.LabelVersion.file).where(
            db.LabelVersion.dataset_id == dataset)).one())
    kept = target.with_name("kept")
    os.link(target, kept)

    def move():
        moved = target.with_name(".moved")
        if swap == "label file linked in":
            os.link(version, moved)
        elif swap == "link to /etc/hostname":
            os.symlink("/etc/hostname", moved)
        elif swap == "sparse GiB":
            with open(moved, "wb") as handle:
                handle.truncate(1 << 30)
        else:
            os.mkfifo(moved)
        os.replace(moved, target)

    _hooked_download(monkeypatch, move)
    served = client.get(f"/v1/releases/{made['id']}/labels", headers=consumer)
    # the checked file's bytes, or a stream stopped short (the rename moved the checked file's status: fail closed)
    assert served.status_code == 200 and honest.startswith(served.content)


def test_a_release_file_written_in_place_while_served_stops_the_download(ctx, client, consumer, dataset,
                                                                         monkeypatch):
    """Written in place after its check (the same descriptor), the rest of the file is not served: the stream
    stops at the first read after the write."""
    made = created(release(client, consumer, dataset, "a", mechanism="rr", epsilon=0.1))
    with ctx.sessions() as s:
        target = ctx.store.path(s.get(db.Release, made["id"]).file)

    def write_in_place():
        with open(target, "r+b") as handle:
            handle.write(b"PAR1")  # (the same bytes: only the file's times move)

    honest = client.get(f"/v1/releases/{made['id']}/labels", headers=consumer).content
    _hooked_download(monkeypatch, write_in_place)
    served = client.get(f"/v1/releases/{made['id']}/labels", headers=consumer)
    assert len(served.content) < len(honest) and honest.startswith(served.content)


@pytest.mark.parametrize("content", [b"{", b'{"key_ids": "abc"}', b'{"key_ids": [], "prefixes": [], '
                                     b'"secret_digests": [], "effective_at": "2026-01-01T00:00:00", '
                                     b'"revoked_by": "x"}'])
def test_a_malformed_revocation_file_is_503_not_500(ctx, client, consumer, dataset, content):
    """The review's M2: a revocation file that is no revocation made every authenticated request a 500. Refused
    (its key would be honoured if it were skipped) with 503 ledger_tampered."""
    directory = ctx.store.path(revocations.DIRECTORY)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "x.json").write_bytes(content)
    refused = client.get(f"/v1/datasets/{dataset}/budget", headers=consumer)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_tampered", refused.text
    assert "is not a revocation" in refused.json()["error"]["message"]


def test_revocations_are_listed_again_only_when_the_directory_changes(ctx, client, consumer, dataset, monkeypatch):
    """The review's M3: 50,000 revocation files made every request list and scan them all (0.072 s instead of
    0.005 s, linear in the count). A request now costs a stat once the directory has settled; more files than
    any deployment revokes keys is refused; a new revocation is still seen at once."""
    listed = []
    real = revocations.os.listdir
    monkeypatch.setattr(revocations.os, "listdir", lambda path: listed.append(path) or real(path))
    monkeypatch.setattr(revocations, "SETTLED_SECONDS", -1.0)  # (the test's directory is seconds old)
    directory = ctx.store.path(revocations.DIRECTORY)
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        assert client.get(f"/v1/datasets/{dataset}/budget", headers=consumer).status_code == 200
    assert len(listed) == 1
    monkeypatch.setattr(revocations, "MAX_REVOCATIONS", 2)
    for name in "abc":
        (directory / f"{name}.json").write_text("{}")
    _tampered(client.get(f"/v1/datasets/{dataset}/budget", headers=consumer), says="more than 2 revocations")
