"""Trainer API keys (the skeleton's :mod:`shared.service.keys`), one organization and role per key: ``admin``
(may also create and replace features tables) or ``member`` (runs jobs, reads results)."""

from __future__ import annotations

from features_party.db import ApiKey, Organization
from shared.service.keys import KeyRing, Principal

__all__ = ["KEYS", "Principal", "authenticate", "create_key"]

KEYS = KeyRing(Organization, ApiKey, roles=("admin", "member"), kind="trn")
create_key = KEYS.create
authenticate = KEYS.authenticate
