"""Who may do what on the trainer: every route needs a trainer key; replacing a features table needs an admin key.
Features tables, id lists, jobs, models and predictions belong to the key's organization (:mod:`features_party.service`
looks them up by it, so another organization's are the 404 of a missing one).

A route declares its guard; the gatekeeper (:mod:`shared.service.gate`) decides it before the body is read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import sessionmaker

from features_party.auth import Principal, authenticate
from features_party.settings import TrainerSettings
from shared.errors import ErrorCode, LabelDPError
from shared.service.gate import Guard


@dataclass(frozen=True)
class Access(Guard):
    """A route's requirement: an admin key or any key, and its body limit (``json``, ``features`` tables or
    ``id_list``)."""

    admin_key: bool = False
    body: Literal["json", "features", "id_list"] = "json"


ANY_KEY = Access()
UPLOAD_FEATURES = Access(admin_key=True, body="features")
# an id list is a job's input, like a job body (any key of the organization), with a limit of its own
UPLOAD_ID_LIST = Access(body="id_list")


@dataclass(frozen=True)
class Admission:
    principal: Principal
    body_limit: int


def admitter(sessions: sessionmaker, settings: TrainerSettings
             ) -> Callable[[Guard, dict[str, str], str], Admission]:
    """The gatekeeper's function: the key (401), then the route's guard (403)."""

    def admit(guard: Guard, _params: dict[str, str], authorization: str) -> Admission:
        with sessions() as session, session.begin():
            principal = authenticate(session, authorization or None)
        assert isinstance(guard, Access)  # service_app refused routes guarded by anything else
        if guard.admin_key and principal.role != "admin":
            raise LabelDPError("creating or replacing a features table needs an admin key", code=ErrorCode.FORBIDDEN)
        limit = {"features": settings.max_features_bytes, "id_list": settings.max_id_list_bytes,
                 "json": settings.max_json_bytes}[guard.body]
        return Admission(principal, limit)

    return admit
