"""What one organization may keep on a service's disk: a quota on its stored data, so that no organization's
uploads and outputs fill the disk every other organization writes to.

Issue 40's twenty-seventh review: with the spool bounded, one organization's admin still filled a 400 MB disk in
50 s with 91 label versions of its own dataset (each kept for good: releases name them), then held the last MiB
with slow bodies — every other organization's creates and releases were 507. Each party counts what an
organization stores (the labels party: its datasets' label versions and the releases it asked for; the trainer:
its directory — features tables, id lists, models and predictions) and refuses, before anything is written or
drawn, a request that would store more once it is at its quota: 507 ``storage_quota_exceeded`` (its own usage:
nothing another organization does shows in it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shared.errors import ErrorCode, LabelDPError


def org_quota(configured: int | None, data_dir: Path) -> int:
    """The bytes one organization may store: ``configured``, or a quarter of the data disk's free space now (the
    process's start): with the spool's quarter, one organization reaches at most half of the disk."""
    if configured is not None:
        return configured
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(data_dir).free // 4


KEPT_FOR_THE_AUDIT = ("datasets, label versions and releases are kept for the audit: the service's operator can "
                      "raise max_stored_bytes_per_org")
DELETE_OR_RAISE = ("delete id lists this organization no longer needs, or ask the service's operator to raise "
                   "max_stored_bytes_per_org")


def check_room(used: int, more: int, quota: int, what: str, remedy: str = DELETE_OR_RAISE) -> None:
    """Refuse ``what`` (507 ``storage_quota_exceeded``, saying what to do: ``remedy``) when the organization,
    storing ``used`` bytes, would store more than ``quota`` with ``more`` bytes besides."""
    if used + more > quota:
        raise LabelDPError(f"{what}: this organization stores {used:,} bytes, and {more:,} more would be over its "
                           f"quota of {quota:,} bytes on this service; {remedy}",
                           code=ErrorCode.STORAGE_QUOTA_EXCEEDED)


def tree_bytes(path: Path) -> int:
    """What the files and directories under ``path`` take of the disk (none if it is missing; links are not
    followed): each at least what the disk allocates to it (:func:`allocated`)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                total += allocated(os.lstat(os.path.join(root, name)))
            except FileNotFoundError:  # removed meanwhile
                continue
    return total


BLOCK = 4096  # what the disk allocates a file or directory at least (a file system's block)


def allocated(stat: os.stat_result) -> int:
    """A file's or directory's bytes on the disk: its size, or the blocks it holds when more (issue 40's 33rd
    review: 20,000 empty directories took 82.4 MB and 20,003 inodes, counted as 14 KB; 800 one-row files 5.2 times
    their sizes)."""
    return max(stat.st_size, getattr(stat, "st_blocks", 0) * 512)
