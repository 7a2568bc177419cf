"""Secrets a durable job needs after its request is gone — a source release's 32-byte secret, the labels-party API
key of a trainer job — sealed with AES-256-GCM (``cryptography``) under the deployment's key, so that no row, file
or log holds them in plain text and any replica holding the key can run the job.

The key comes from the settings (:class:`SecretKeySettings`): ``secret_key`` (base64 or hex of 32 bytes, from the
environment) or ``secret_key_file`` (a file made by ``labeldp <party> secret-key``, mode 0600, read at every use,
so removing it stops pending jobs with a clear code rather than a crash). With neither, a service gets a key for
its process only (:func:`sealer`): jobs work in that process, and a job it leaves behind cannot be opened by any
other — it fails with ``secret_key_missing``; replicas need a shared key.

A sealed value is ``b"LDS1" ‖ key id (8 bytes) ‖ nonce (12 bytes) ‖ ciphertext ‖ tag`` and is bound to what it is
for (``context``, e.g. ``"release-secret:<release id>"``, the GCM associated data): a sealed value copied into
another row does not open there.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, SecretStr

from shared.errors import ErrorCode, LabelDPError
from shared.service.keyfiles import create_private_file, read_private_file

MAGIC = b"LDS1"
KEY_BYTES = 32
_KEY_ID_BYTES, _NONCE_BYTES = 8, 12


class SecretKeySettings(BaseModel):
    """Settings mixin: where the sealing key comes from (both unset: a key for this process only)."""

    secret_key: SecretStr | None = None
    secret_key_file: Path | None = None


def parse_key(text: str) -> bytes:
    """32 bytes from base64 or hex (what ``secret-key`` writes: base64)."""
    text = text.strip()
    for decode in (bytes.fromhex, lambda t: base64.b64decode(t, validate=True)):
        try:
            key = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(key) == KEY_BYTES:
            return key
    raise LabelDPError("the secret key must be 32 bytes, base64 or hex (make one with `labeldp <party> secret-key`)",
                       code=ErrorCode.USAGE)


def read_key_file(path: Path) -> bytes | None:
    """The key in ``path``; None if the file is gone. Refused if others may read it. Never shows it."""
    data = read_private_file(path, what="the secret key file", code=ErrorCode.SECRET_KEY_MISSING)
    if data is None:
        return None
    try:
        return parse_key(data.decode("ascii"))
    except UnicodeDecodeError:
        raise LabelDPError("the secret key file cannot be read", code=ErrorCode.SECRET_KEY_MISSING) from None


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"labeldp sealing key id\x00" + key).digest()[:_KEY_ID_BYTES]


@dataclass(frozen=True)
class Sealer:
    """Seals and opens secrets with the key ``load()`` returns at each use (None: no key now)."""

    load: Callable[[], bytes | None]
    ephemeral: bool = False  # a key of this process only: what it seals dies with it

    def seal(self, secret: bytes, context: str) -> bytes:
        key = self._key()
        nonce = os.urandom(_NONCE_BYTES)
        return MAGIC + key_id(key) + nonce + AESGCM(key).encrypt(nonce, secret, context.encode())

    def open(self, sealed: bytes, context: str) -> bytes:
        """The secret, or a refusal with a code: ``secret_key_missing`` (no key now, or not the key it was sealed
        with) or ``sealed_secret_damaged`` (altered, or sealed for another context)."""
        head = len(MAGIC) + _KEY_ID_BYTES + _NONCE_BYTES
        if len(sealed) < head + 16 or not sealed.startswith(MAGIC):
            raise LabelDPError("a sealed secret is damaged", code=ErrorCode.SEALED_SECRET_DAMAGED)
        key = self._key()
        if key_id(key) != sealed[len(MAGIC):len(MAGIC) + _KEY_ID_BYTES]:
            raise LabelDPError("this job's secret was sealed with another secret key than the one configured (a "
                               "process-only key, or a key that was replaced)", code=ErrorCode.SECRET_KEY_MISSING)
        try:
            return AESGCM(key).decrypt(sealed[head - _NONCE_BYTES:head], sealed[head:], context.encode())
        except InvalidTag:
            raise LabelDPError("a sealed secret is damaged", code=ErrorCode.SEALED_SECRET_DAMAGED) from None

    def _key(self) -> bytes:
        key = self.load()
        if key is None:
            raise LabelDPError("no secret key is configured (secret_key or secret_key_file): the job's sealed "
                               "secrets cannot be opened", code=ErrorCode.SECRET_KEY_MISSING)
        return key


def sealer(settings: SecretKeySettings) -> Sealer:
    """The deployment's sealer: the configured key, or a fresh key for this process only."""
    if settings.secret_key is not None:
        key = parse_key(settings.secret_key.get_secret_value())
        return Sealer(lambda: key)
    if settings.secret_key_file is not None:
        path = settings.secret_key_file
        read_key_file(path)  # a malformed or exposed file is refused at start, not at the first job
        return Sealer(lambda: read_key_file(path))
    key = AESGCM.generate_key(bit_length=256)
    return Sealer(lambda: key, ephemeral=True)


def write_key_file(path: Path) -> None:
    """A new random key in ``path`` (created 0600; an existing file is never overwritten)."""
    create_private_file(path, base64.b64encode(os.urandom(KEY_BYTES)) + b"\n",
                        exists=f"{path} exists; a secret key is never overwritten (jobs sealed with it would be lost)")
