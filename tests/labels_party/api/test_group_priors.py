"""Group priors: one discrete-Laplace prior and one randomizer per features-only group, composed in parallel."""

from __future__ import annotations

import numpy as np
import pytest

from features_party.client import LabelsPartyClient, LabelsPartyError
from labeldp.local_services import serve_in_thread
from labels_party.core.pipeline import prepare_groups, privatize_by_group
from labels_party.http.api import create_app
from labels_party.http.audit import verify_audit
from labels_party.http.auth import create_key
from labels_party.runtime.context import make_context
from labels_party.runtime.settings import LabelsSettings
from shared.domains import Classes, integer_range


def test_per_group_randomizers_are_unbiased_and_certified():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 3, size=60_000)
    labels = np.clip(np.rint(12 * groups + rng.normal(0, 3, size=groups.size)), 0, 30)
    result = privatize_by_group(prepare_groups(integer_range(0, 30), "opt-unbiased", 2.0, prior_epsilon=0.5),
                                labels, groups, np.random.default_rng(1))
    assert len(result.parts) == 3 and result.certified_epsilon <= 2.0
    for g, part in enumerate(result.parts):
        members = groups == g
        error = result.noisy_labels[members] - labels[members]
        assert abs(error.mean()) < 4 * error.std() / np.sqrt(members.sum())
        assert part.split.prior_epsilon == 0.5 and part.prior.certified_epsilon <= 0.5
        # each group's noisy prior concentrates where that group's labels are
        assert abs(part.prior.weights @ np.arange(31) - 12 * g) < 3


def test_classes_get_rr_with_prior_per_group():
    rng = np.random.default_rng(2)
    groups = rng.integers(0, 2, size=20_000)
    # Two likely classes per group: RRWithPrior at ε₂ = 0.8 keeps k = 2 of 5 (e^0.8/(e^0.8 + 1) · 0.9 ≈ 0.62 correct).
    # (With one class 8x as likely as the next it would keep k = 1 — every label released as that class, 80%
    # "agreement" and no information — and the release falls back to RR instead: test_uninformative.py.)
    labels = np.where(groups == 0, rng.choice(5, size=groups.size, p=[0.45, 0.45, 0.04, 0.03, 0.03]),
                      rng.choice(5, size=groups.size, p=[0.03, 0.03, 0.04, 0.45, 0.45]))
    result = privatize_by_group(prepare_groups(Classes(5), "rr-with-prior", 1.0, prior_epsilon=0.2), labels, groups,
                                np.random.default_rng(3))
    assert [part.mechanism.num_outputs for part in result.parts] == [2, 2]
    agreement = np.mean(result.noisy_labels == labels)
    plain_rr = np.exp(1.0) / (np.exp(1.0) + 4)
    assert agreement > plain_rr + 0.15  # per-group priors beat RR at the same total ε (≈ 0.62 against 0.40)


def test_group_release_over_http_composes_in_parallel(tmp_path):
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data")
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    rng = np.random.default_rng(4)
    groups = rng.integers(0, 4, size=1200)
    labels = np.clip(np.rint(10 * groups + rng.normal(0, 2, size=1200)), 0, 40).astype(int)
    ids = [f"g{i}" for i in range(1200)]
    with serve_in_thread(create_app(ctx)) as base, LabelsPartyClient(base, admin) as client:
        dataset = client.create_dataset(name="g", label_kind="integer", min=0, max=40, epsilon_total=1.0).id
        client.upload_labels(dataset, ids, labels)
        release = client.request_group_release(dataset, ids, groups, "opt-unbiased", 1.0, 0.25,
                                               idempotency_key="groups")
        assert release.certified_epsilon <= 1.0 and release.prior_epsilon == 0.25
        assert release.description["num_groups"] == 4
        described = client.mechanism_document(release.mechanism_hash)["description"]
        groups_described = described["groups"]
        assert groups_described["group"] == ["0", "1", "2", "3"]
        assert sum(groups_described["examples"]) == 1200 and len(groups_described["noisy_counts"]) == 4
        assert all(len(counts) == 41 for counts in groups_described["noisy_counts"])
        assert described["grid"] == list(range(41)) and described["noisy_prior"]["epsilon"] == 0.25
        again = client.request_group_release(dataset, ids, groups, "opt-unbiased", 1.0, 0.25,
                                             idempotency_key="groups")
        assert again.id == release.id
        assert client.budget(dataset).epsilon_spent == 1.0  # not 4 x 1.0: the groups are disjoint
        with pytest.raises(LabelsPartyError) as unknown:
            client.request_group_release(dataset, ["g1", "nobody"], [0, 1], "opt-unbiased", 0.5, 0.1)
        assert unknown.value.code == "unknown_example_ids"
        with pytest.raises(LabelsPartyError) as wrong:
            client.request_group_release(dataset, ids, groups, "laplace", 0.5, 0.1)
        assert wrong.value.code == "invalid_request"  # the schema names the group mechanisms
        assert "opt-unbiased" in str(wrong.value)
        events = client.audit(dataset).events
    # Charged before any group's prior was drawn: what every example pays, its own group's prior and randomizer
    # (the groups are disjoint); each group's mechanism certifies within it
    charged = events[0].record["dp_event"]
    assert len(events) == 1 and charged["type"] == "ComposedDpEvent"
    assert [e["type"] for e in charged["events"]] == ["DiscreteLaplaceDpEvent", "LocalRandomizerDpEvent"]
    bound = charged["events"][1]["epsilon"]
    assert bound == pytest.approx(0.75, abs=1e-9) and all(
        described["mechanisms"][i]["certified_epsilon"] <= bound for i in groups_described["mechanism"])
    assert max(groups_described["certified_epsilon"]) <= 1.0
    assert verify_audit(ctx)["valid"]


def test_too_many_groups_are_refused_before_anything_is_drawn(tmp_path):
    """The review of issue 26: 2000 one-example groups took 15 s and a 141 MB document for one request. Groups are
    public (they come from features): too many are refused before the charge."""
    ctx = make_context(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "data",
                       settings=LabelsSettings(max_groups_per_release=256, max_document_bytes=32 << 20))
    with ctx.sessions() as session, session.begin():
        admin = create_key(ctx.ledger, session, "owner", "admin")
    ids = [f"g{i}" for i in range(600)]
    with serve_in_thread(create_app(ctx)) as base, LabelsPartyClient(base, admin) as client:
        dataset = client.create_dataset(name="g", label_kind="integer", min=0, max=40, epsilon_total=1.0).id
        client.upload_labels(dataset, ids, np.arange(600) % 41)
        with pytest.raises(LabelsPartyError) as refused:
            client.request_group_release(dataset, ids, np.arange(600) % 300, "rr-on-bins", 1.0, 0.25)
        assert refused.value.code == "too_many_groups" and "at most 256" in str(refused.value)
        wide = client.create_dataset(name="w", label_kind="integer", min=0, max=199, epsilon_total=1.0).id
        client.upload_labels(wide, ids, np.arange(600) % 200)
        with pytest.raises(LabelsPartyError) as cells:  # 60 groups x 200 x 400 exact counts: 4.8·10⁶, 38 MB
            client.request_group_release(wide, ids, np.arange(600) % 60, "opt-unbiased", 1.0, 0.25)
        assert cells.value.code == "document_too_large" and "33,554,432" in str(cells.value)
        for refused_on in (dataset, wide):
            assert client.budget(refused_on).epsilon_spent == 0.0 and client.audit(refused_on).events == []
        assert client.request_group_release(dataset, ids, np.arange(600) % 20, "opt-unbiased", 1.0, 0.25).id


def test_a_small_body_of_long_group_names_is_not_expanded(tmp_path):
    """The second review of issue 26: 2·10⁶ rows naming a thousand 900-character groups make a 2 MB Parquet body
    (dictionary-encoded); expanding it to one fixed-width string per row took the server to 8.7 GB before any
    refusal. The groups are kept as references to one name each, and names are bounded."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2_000_000
    body = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"example_id": pa.array(np.char.add("e", np.arange(rows).astype(str))),
                             "group": pa.DictionaryArray.from_arrays(
                                 pa.array(np.arange(rows) % 1000, pa.int32()),
                                 pa.array(["g" * 900 + str(i) for i in range(1000)]))}), body, compression="zstd")
    assert body.stat().st_size < 5 << 20
    # No decoded-size limit here (by default it refuses this body, body_too_large: tests/labels_party/api/
    # test_hostile_bodies.py): the names are checked as they are read. VmHWM, not ru_maxrss: the latter keeps the
    # forking parent's peak across exec (pytest's, gigabytes late in a run)
    probe = ("import pathlib, re, sys\n"
             "from labels_party.store.uploads import parse_groups\n"
             "from shared.errors import LabelDPError\n"
             "try:\n    parse_groups(pathlib.Path(sys.argv[1]), 'parquet', max_bytes=1 << 40)\n"
             "except LabelDPError as err:\n    print(err.code)\n"
             "print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(body)], capture_output=True, text=True, timeout=300)
    code, peak_mb = done.stdout.split()
    assert code == "malformed_file" and int(peak_mb) < 1000, done.stdout + done.stderr  # names over 200 chars
