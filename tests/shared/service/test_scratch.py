"""Spooled request bodies (raw labels among them) live under the service's data directory, private to its user,
and what a killed process leaves there is removed when a service starts — while a live process's stays (issue 26).
The processes here are real: a subprocess spools a real request body and is killed with SIGKILL mid-body."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from features_party.process import make_context as trainer_context
from features_party.settings import TrainerSettings
from labels_party.runtime.context import make_context as labels_context
from shared.service import spool
from shared.service.scratch import Scratch

ROOT = Path(__file__).resolve().parents[3]

# A process that claims the data directory, starts spooling a request body (its first chunk arrives, the rest
# never does), prints its spool directory and waits to be killed.
_SPOOLING = textwrap.dedent("""
    import asyncio, sys
    from starlette.requests import Request
    from shared.service import spool
    from shared.service.scratch import Scratch

    scratch = Scratch(sys.argv[1])

    async def main():
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                # larger than the file's buffer: on disk before the process dies
                return {"type": "http.request", "body": b"example_id,label\\n" + b"secret,1\\n" * 10000,
                        "more_body": True}
            print(scratch.spools, flush=True)
            await asyncio.sleep(3600)

        scope = {"type": "http", "method": "PUT", "path": "/", "headers": [(b"content-type", b"text/csv")]}
        async with spool.spooled(Request(scope, receive), 1 << 20, scratch):
            pass

    asyncio.run(main())
""")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _spooling(data_dir: Path) -> tuple[subprocess.Popen, Path]:
    """A live process with a body half spooled; its spool directory (holding that body)."""
    process = subprocess.Popen([sys.executable, "-c", _SPOOLING, str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    spools = Path(process.stdout.readline().strip())
    bodies = list(spools.glob("body-*/body"))
    assert len(bodies) == 1 and b"secret" in bodies[0].read_bytes()
    return process, spools


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()


def test_a_body_is_spooled_under_the_data_directory_privately(tmp_path):
    scratch = Scratch(tmp_path / "data")
    app, seen = FastAPI(), {}

    @app.put("/body")
    async def put(request: Request):
        async with spool.spooled(request, 1 << 20, scratch) as body:
            seen.update(path=body.path, file=_mode(body.path), directories=[
                _mode(p) for p in (body.path.parent, scratch.spools, scratch.spools.parent, tmp_path / "data/tmp")],
                sha256=body.sha256, content=body.path.read_bytes())
        return {}

    previous = os.umask(0)  # the modes must not depend on the process's umask
    try:
        assert TestClient(app).put("/body", content=b"example_id,label\na,1\n").status_code == 200
    finally:
        os.umask(previous)
    assert seen["path"].is_relative_to(tmp_path / "data" / "tmp" / "spool")
    assert seen["file"] == 0o600 and seen["directories"] == [0o700] * 4
    assert seen["content"] == b"example_id,label\na,1\n"
    assert seen["sha256"] == hashlib.sha256(seen["content"]).hexdigest()
    assert not seen["path"].exists() and not seen["path"].parent.exists()  # the request's directory is gone
    scratch.close()
    assert not scratch.spools.exists()  # an orderly end removes the process's own spool directory


def _labels(tmp_path: Path, data_dir: Path):
    return labels_context(f"sqlite:///{tmp_path}/db.sqlite", data_dir)


def _trainer(tmp_path: Path, data_dir: Path):
    return trainer_context(TrainerSettings(database_url=f"sqlite:///{tmp_path}/trainer.db", data_dir=data_dir))


@pytest.mark.parametrize("start", [_labels, _trainer], ids=["labels", "trainer"])
def test_a_killed_process_spool_goes_at_startup_a_live_ones_stays(tmp_path, start):
    data_dir = tmp_path / "data"
    dead, dead_spools = _spooling(data_dir)
    live, live_spools = _spooling(data_dir)
    stray = data_dir / "orgs" / "1" / f".table.{'0' * 32}.tmp"  # a write a crash interrupted
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"half a file")
    try:
        _kill(dead)
        assert dead_spools.exists()  # the kernel released its lock; nothing removed it yet
        ctx = start(tmp_path, data_dir)
        assert not dead_spools.exists()
        assert list(live_spools.glob("body-*/body"))  # a live process's body is not touched
        assert stray.exists()  # nor anything it may be writing: another process is live
        assert ctx.scratch.spools.is_relative_to(data_dir / "tmp" / "spool")
        ctx.scratch.close()
    finally:
        _kill(live)
    ctx = start(tmp_path, data_dir)  # alone now
    assert not live_spools.exists() and not stray.exists()
    assert [p.name for p in (data_dir / "tmp" / "spool").iterdir()] == [ctx.scratch.spools.name]
    ctx.scratch.close()


def test_two_contexts_on_one_data_directory_keep_their_spools(tmp_path):
    first = Scratch(tmp_path / "data")
    second = Scratch(tmp_path / "data")
    assert first.spools.exists() and second.spools.exists() and first.spools != second.spools
    with first.alone() as alone:
        assert not alone  # the second holds the data directory too
    second.close()
    with first.alone() as alone:
        assert alone
    first.close()
