"""Labels-party API keys (the skeleton's :mod:`shared.service.keys`), one role per key: admin (the dataset
owner's) or consumer (a granted organization's)."""

from __future__ import annotations

from labels_party.db import ApiKey, Organization
from shared.service.keys import KeyRing, Principal

__all__ = ["KEYS", "Principal", "authenticate", "create_key"]

KEYS = KeyRing(Organization, ApiKey, roles=("admin", "consumer"), kind="ldp")
create_key = KEYS.create
authenticate = KEYS.authenticate
