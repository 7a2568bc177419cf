"""verify-audit in a loop while a live labels service charges releases (issue 28: "verify-audit in a loop during
1000 releases on PostgreSQL is clean"). Every verify run reads the exported signed heads first and checks them.

Run (PostgreSQL from .ci/postgres.sh, or any SQLAlchemy URL; a fresh database is needed):
`PYTHONPATH=. .venv/bin/python bench/audit_under_load.py --database-url postgresql+psycopg://… [--releases 1000]
[--workers 2] [--json]`

Goal: zero invalid runs, zero problems, zero errors; prints the verify runs' count and median/max seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.audit_load import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="an empty database")
    parser.add_argument("--releases", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        result = run(args.database_url, Path(root), args.releases, args.workers)
    clean = not result["errors"] and not result["problems"] and not result["verify_runs_invalid"]
    result["clean"] = clean and result["final_valid"]
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
