"""A table on disk is one Parquet file, or a directory of part files (a Spark job's output)."""

from __future__ import annotations

from pathlib import Path


def parquet_parts(path: Path) -> list[Path]:
    """A Parquet file, or a directory of part files (a Spark job's output) in their order."""
    return sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
