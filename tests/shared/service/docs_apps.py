"""Both services' applications on a fresh database, for the tests of their documentation pages; each with an
operation of its own that the pages must show."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

SERVICES = {"labels": "/v1/datasets", "features": "/v1/jobs"}


def service_app(kind: str, tmp_path: Path) -> FastAPI:
    if kind == "labels":
        from labels_party.http.api import create_app
        from labels_party.runtime.context import make_context

        return create_app(make_context(f"sqlite:///{tmp_path}/labels.db", tmp_path / "labels"))
    from features_party.api import create_app as create_trainer
    from features_party.process import make_context as make_trainer_context
    from features_party.settings import TrainerSettings

    return create_trainer(make_trainer_context(TrainerSettings(
        database_url=f"sqlite:///{tmp_path}/trainer.db", data_dir=tmp_path / "trainer")))
