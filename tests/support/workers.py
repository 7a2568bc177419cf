"""Helpers of the ``serve --workers N`` tests: the worker processes of a uvicorn supervisor, which of them holds a
client's connection (from /proc: no route of the service says which process answered), and an application
factory that refuses to start."""

from __future__ import annotations

import os
from pathlib import Path

from shared.errors import LabelDPError


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's live worker processes (multiprocessing's spawned children, not its resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if int(fields[1]) == supervisor and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def holder_of_connection(server_port: int, client_port: int, pids: set[int]) -> int | None:
    """Which of ``pids`` holds the server's end of the loopback TCP connection from ``client_port``."""
    inodes = set()
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inodes.add(f"socket:[{inode}]")
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None


def refuse_to_start(_settings):
    """A party's ``build`` that refuses to start, as one whose database is behind its data directory does."""
    raise LabelDPError("this worker refuses to start", code="usage")
