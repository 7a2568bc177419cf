"""Sealed job secrets (shared.service.sealing): AES-256-GCM under the deployment's key, bound to their context;
a missing, replaced or exposed key is a clear code, never a crash; the key file command never prints the key."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest
from pydantic import SecretStr

from shared.errors import LabelDPError
from shared.service.sealing import Sealer, SecretKeySettings, parse_key, sealer, write_key_file

SECRET = bytes(range(32))


def _code(call) -> str:
    with pytest.raises(LabelDPError) as raised:
        call()
    return raised.value.code


def test_a_sealed_secret_opens_only_in_its_context_and_hides_the_secret():
    box = sealer(SecretKeySettings(secret_key=SecretStr(os.urandom(32).hex())))
    sealed = box.seal(SECRET, "release-secret:r1")
    assert SECRET not in sealed and len(sealed) == 4 + 8 + 12 + 32 + 16
    assert box.open(sealed, "release-secret:r1") == SECRET
    assert box.seal(SECRET, "release-secret:r1") != sealed  # a fresh nonce each time
    assert _code(lambda: box.open(sealed, "release-secret:r2")) == "sealed_secret_damaged"  # moved to another row
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert _code(lambda: box.open(flipped, "release-secret:r1")) == "sealed_secret_damaged"
    assert _code(lambda: box.open(b"junk", "release-secret:r1")) == "sealed_secret_damaged"


def test_another_key_or_no_key_is_secret_key_missing(tmp_path):
    path = tmp_path / "secret.key"
    write_key_file(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    box = sealer(SecretKeySettings(secret_key_file=path))
    sealed = box.seal(SECRET, "c")
    other = sealer(SecretKeySettings(secret_key=SecretStr(base64.b64encode(os.urandom(32)).decode())))
    assert _code(lambda: other.open(sealed, "c")) == "secret_key_missing"
    process_only = sealer(SecretKeySettings())
    assert process_only.ephemeral
    assert _code(lambda: process_only.open(sealed, "c")) == "secret_key_missing"
    path.unlink()  # the file removed: the next use says so
    assert _code(lambda: box.open(sealed, "c")) == "secret_key_missing"
    assert _code(lambda: Sealer(lambda: None).seal(SECRET, "c")) == "secret_key_missing"


def test_key_files_are_never_overwritten_and_never_readable_by_others(tmp_path):
    path = tmp_path / "secret.key"
    write_key_file(path)
    before = path.read_bytes()
    assert _code(lambda: write_key_file(path)) == "usage"
    assert path.read_bytes() == before
    path.chmod(0o644)
    assert _code(lambda: sealer(SecretKeySettings(secret_key_file=path))) == "secret_key_missing"
    assert len(parse_key(before.decode())) == 32
    assert _code(lambda: parse_key("abcd")) == "usage"


@pytest.mark.parametrize("party", ["labels", "features"])
def test_the_secret_key_command_writes_the_key_and_prints_nothing_of_it(tmp_path, party):
    path = tmp_path / "k"
    done = subprocess.run([sys.executable, "-m", "labeldp", party, "secret-key", "--key-file", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    key = path.read_text().strip()
    assert len(base64.b64decode(key)) == 32
    assert key not in done.stdout + done.stderr and done.stdout == ""
    again = subprocess.run([sys.executable, "-m", "labeldp", party, "secret-key", "--key-file", str(path)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    assert path.read_text().strip() == key
