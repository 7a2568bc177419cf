"""Signed chain heads: what lets an outsider check that the database was not rewritten or truncated.

A dataset's chain head (its sequence number and hash) is signed with the service's Ed25519 audit key (a file set
in settings, ``LABELDP_AUDIT_KEY_FILE``, made by ``labeldp labels audit-key``) and, after every commit that moved
it, appended to ``heads.jsonl`` in a directory outside the database and the data directory
(``LABELDP_AUDIT_LOG_DIR``): one JSON line per head, fsynced, never rewritten. Anyone holding the public key can
pin a head (a line of that file, or ``GET /v1/audit/heads``) and later have ``verify-audit --pinned`` prove the
chain still contains it and continues from it. Whoever can write the database cannot forge a head (no key), and
cannot drop or rewrite what a pinned head covers without the chain no longer containing it.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import stat
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from labels_party.ledger.records import canonical
from shared.errors import ErrorCode, LabelDPError
from shared.service.keyfiles import create_private_file, read_private_file

# Signed bytes start with this, so that a head signature can never be mistaken for a signature of anything else.
CONTEXT = b"labeldp audit head v1\n"
LOG_NAME = "heads.jsonl"


@dataclass(frozen=True)
class SignedHead:
    """A dataset's chain at ``seq`` ends with ``head``, as the holder of key ``key_id`` said at ``signed_at``; an
    exported head is a *transition*: the entries after ``previous_seq`` (whose hash was ``previous_head``) up to
    ``seq`` were written by one committed transaction of the service. A log of transitions that join up covers
    every entry the service wrote; an entry no transition covers was written by someone else (or by a process that
    died between its commit and its export)."""

    dataset_id: str
    seq: int
    head: str
    signed_at: str
    key_id: str  # the first 16 hex digits of SHA-256 of the raw public key
    signature: str  # hex
    previous_seq: int | None = None  # None: a head signed on request (GET /v1/audit/heads), not a transition
    previous_head: str | None = None

    def payload(self) -> bytes:
        body: dict[str, object] = {"dataset_id": self.dataset_id, "seq": self.seq, "head": self.head,
                                   "signed_at": self.signed_at}
        if self.previous_seq is not None:
            body.update(previous_seq=self.previous_seq, previous_head=self.previous_head)
        return CONTEXT + canonical(body).encode()

    @property
    def transition(self) -> bool:
        return self.previous_seq is not None and self.previous_head is not None

    def line(self) -> str:
        return canonical(asdict(self))

    @classmethod
    def parse(cls, data: dict) -> SignedHead:
        previous_seq, previous_head = data.get("previous_seq"), data.get("previous_head")
        return cls(str(data["dataset_id"]), int(data["seq"]), str(data["head"]), str(data["signed_at"]),
                   str(data["key_id"]), str(data["signature"]),
                   None if previous_seq is None else int(previous_seq),
                   None if previous_head is None else str(previous_head))

    def signed_by(self, public: Ed25519PublicKey) -> bool:
        try:
            public.verify(bytes.fromhex(self.signature), self.payload())
        except (InvalidSignature, ValueError):
            return False
        return True


def public_hex(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(bytes.fromhex(public_hex(public))).hexdigest()[:16]


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A public key as ``audit-key`` prints it: 64 hex digits (the raw key)."""
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text.strip()))
    except ValueError:
        raise LabelDPError("an audit public key is 64 hexadecimal digits (as labeldp labels audit-key prints it)",
                           code=ErrorCode.INVALID_INPUT) from None


def create_key_file(path: Path) -> Ed25519PublicKey:
    """A new Ed25519 key in ``path`` (PKCS #8 PEM, mode 0600, never an existing file); its public key."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    create_private_file(path, pem, exists=f"{path.name} already exists: an audit key is never overwritten (heads "
                                          "signed with it would no longer verify)")
    return key.public_key()


def load_or_create_key_file(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The audit key at ``path``, made there first if there is none (whether it was made now): written whole to a
    private temporary file, then linked into place — never over an existing key, and never seen half written by a
    process starting beside this one (which then loads the winner's key)."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(8).hex()}.tmp")
        create_private_file(temporary, pem, exists="a temporary audit key exists")
        try:
            os.link(temporary, path)
            return key, True
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            temporary.unlink()
    return load_key_file(path), False


def load_key_file(path: Path) -> Ed25519PrivateKey:
    """The audit key; refused if others may read it (or it is not an Ed25519 key). The message never shows it."""
    hint = "; make one with labeldp labels audit-key"
    data = read_private_file(path, what="the audit key file (LABELDP_AUDIT_KEY_FILE)", code=ErrorCode.USAGE, hint=hint)
    if data is None:
        raise LabelDPError(f"the audit key file (LABELDP_AUDIT_KEY_FILE) cannot be read{hint}", code=ErrorCode.USAGE)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise LabelDPError("the audit key file is not an Ed25519 private key (PEM)", code=ErrorCode.USAGE)
    return key


@dataclass(frozen=True)
class HeadSigner:
    """The audit key and where signed heads go (``directory/heads.jsonl``; None: signed on request only)."""

    key: Ed25519PrivateKey
    directory: Path | None

    @property
    def public(self) -> Ed25519PublicKey:
        return self.key.public_key()

    def sign(self, dataset_id: str, seq: int, head: str, previous: tuple[int, str] | None = None) -> SignedHead:
        """``previous``: the head before the transaction that wrote up to ``seq`` (an exported transition)."""
        unsigned = SignedHead(dataset_id, int(seq), head, datetime.now(timezone.utc).isoformat(),
                              key_id(self.public), "", None if previous is None else int(previous[0]),
                              None if previous is None else previous[1])
        return SignedHead(**{**asdict(unsigned), "signature": self.key.sign(unsigned.payload()).hex()})

    def digest(self, purpose: str, secret: str) -> str:
        """A keyed digest of ``secret`` (HMAC-SHA256 under a key derived from the audit key for ``purpose``): what
        the database stores of a secret it must recognize, so that a database writer cannot make a row for a secret
        of their own (issue 40's review: a console session row inserted with the SHA-256 of the writer's token)."""
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                       info=f"labeldp {purpose} v1".encode()).derive(self.key.private_bytes_raw())
        return hmac.new(derived, secret.encode(), hashlib.sha256).hexdigest()

    def export(self, signed: SignedHead) -> None:
        """Append one line, durably; concurrent writers (threads, processes) each append whole lines."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # not waiting on a FIFO or following a link put in its place (the thirty-eighth review's pipe held a charge's
        # request until a reader came, and took its head): a log that is no regular file is refused
        descriptor = os.open(self.directory / LOG_NAME,
                             os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise OSError(f"the heads log {LOG_NAME} is not a regular file")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            os.write(descriptor, (signed.line() + "\n").encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)  # releases the lock


def read_heads(path: Path) -> list[SignedHead]:
    """Signed heads from a file of JSON lines (an exported log, or one pinned line); a malformed line is refused,
    but for an exported log's unterminated last line."""
    try:
        text = path.read_text()
    except OSError:
        raise LabelDPError(f"cannot read the pinned heads file {path.name}", code=ErrorCode.USAGE) from None
    lines = text.split("\n")
    heads = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            heads.append(SignedHead.parse(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            if number == len(lines) and len(lines) > 1:  # an exported line cut short by a crash (no newline yet)
                continue
            raise LabelDPError(f"line {number} of {path.name} is not a signed head", code=ErrorCode.USAGE) from None
    return heads


def read_log(directory: Path) -> list[SignedHead]:
    """Every head a service exported to ``directory`` (none yet: an empty list)."""
    path = directory / LOG_NAME
    return read_heads(path) if path.exists() else []
