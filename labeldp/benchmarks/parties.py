"""Both parties for a benchmark: a labels-party service and a trainer service, each a real uvicorn server on
loopback in this process, talking HTTP exactly as in a deployment. Only the labels party's randomness differs:
a benchmark injects a seeded source so that runs repeat (``shared.randomness.SeededSource``); a deployment
always draws from the cryptographic one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from features_party.client import LabelsPartyClient
from features_party.trainer_client import TrainerClient
from labeldp.local_services import serve_in_thread

OWNER, CONSUMER = "labels-owner", "publisher"  # the two organizations
LABELS_PARTY = "office"  # the name the trainer knows the labels party by


@dataclass(frozen=True)
class Parties:
    labels_url: str
    trainer_url: str
    owner_key: str  # labels party, admin of the owner organization
    consumer_key: str  # labels party, the publisher's consumer key (what jobs carry)
    trainer_key: str  # trainer, the publisher's admin key

    def owner(self) -> LabelsPartyClient:
        return LabelsPartyClient(self.labels_url, self.owner_key, timeout=600)

    def consumer(self) -> LabelsPartyClient:
        return LabelsPartyClient(self.labels_url, self.consumer_key, timeout=600)

    def trainer(self) -> TrainerClient:
        return TrainerClient(self.trainer_url, self.trainer_key)

    def job(self, features: str, dataset_id: str, **fields) -> dict:
        """A job request of the publisher on the labels party (fields: release or release_id, columns, train)."""
        return {"features": features, "labels_party": LABELS_PARTY, "dataset_id": dataset_id,
                "api_key": self.consumer_key, **fields}


@contextlib.contextmanager
def two_parties(workdir: Path, seed: int) -> Iterator[Parties]:
    from features_party.api import create_app as trainer_app
    from features_party.auth import create_key as trainer_key
    from features_party.process import make_context as trainer_context
    from features_party.settings import TrainerSettings
    from labels_party.http.api import create_app as labels_app
    from labels_party.http.auth import create_key as labels_key
    from labels_party.runtime.context import make_context as labels_context
    from shared.randomness import SeededSource

    workdir = Path(workdir)
    labels = labels_context(f"sqlite:///{workdir}/labels.db", workdir / "labels", random_source=SeededSource(seed))
    with labels.sessions() as session, session.begin():
        owner = labels_key(labels.ledger, session, OWNER, "admin")
        consumer = labels_key(labels.ledger, session, CONSUMER, "consumer")
    with serve_in_thread(labels_app(labels)) as labels_url:
        trainer = trainer_context(TrainerSettings(database_url=f"sqlite:///{workdir}/trainer.db",
                                                  data_dir=workdir / "trainer",
                                                  labels_parties={LABELS_PARTY: labels_url}))
        with trainer.sessions() as session, session.begin():
            publisher = trainer_key(session, CONSUMER, "admin")
        trainer.jobs.start()  # the trainer's job workers, as `labeldp features serve` starts them
        try:
            with serve_in_thread(trainer_app(trainer)) as trainer_url:
                yield Parties(labels_url, trainer_url, owner, consumer, publisher)
        finally:
            trainer.jobs.stop()
