"""The path of a request through the code (issue 42): which of this project's modules a request's Python calls enter,
and the cross-module call edges between them, traced with ``sys.setprofile`` in every thread while one request is
answered by an in-process labels party (SQLite in a temporary directory, seeded labels).

Requests traced: a label release (opt-unbiased on integers 0..40), a group release (CSV body), a release check, a
dataset's budget. Modules are counted by package (``labels_party.releases.transaction`` …); calls inside one module
are not edges.

Run: `.venv/bin/python bench/request_path.py [--json]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OURS = ("labels_party", "shared", "features_party", "labeldp")


@contextmanager
def traced(modules: set[str], edges: set[tuple[str, str]]):
    """Every Python call made meanwhile, in any thread: its module, and (caller module, callee module) edges."""

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith(OURS):
            return
        modules.add(callee)
        caller = frame.f_back
        # the nearest caller frame in our code (a library in between — SQLAlchemy, Starlette — is skipped)
        while caller is not None and not caller.f_globals.get("__name__", "").startswith(OURS):
            caller = caller.f_back
        if caller is not None and caller.f_globals["__name__"] != callee:
            edges.add((caller.f_globals["__name__"], callee))

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def trace(send: Callable[[], object]) -> dict:
    modules: set[str] = set()
    edges: set[tuple[str, str]] = set()
    with traced(modules, edges):
        answer = send()
    status = getattr(answer, "status_code", None)
    by_package: dict[str, int] = {}
    for module in modules:
        package = ".".join(module.split(".")[:2]) if module.count(".") > 1 else module.split(".")[0]
        by_package[package] = by_package.get(package, 0) + 1
    return {"status": status, "modules": len(modules), "edges": len(edges), "by_package": dict(sorted(
        by_package.items())), "module_names": sorted(modules)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    import numpy as np
    from fastapi.testclient import TestClient

    from labels_party.http.api import create_app
    from labels_party.http.auth import create_key
    from labels_party.runtime.context import make_context
    from shared.randomness import SeededSource

    with tempfile.TemporaryDirectory(prefix="labeldp-path-") as directory:
        ctx = make_context(f"sqlite:///{directory}/db.sqlite", Path(directory) / "data",
                           random_source=SeededSource(0))
        with ctx.sessions() as session, session.begin():
            key = create_key(ctx.ledger, session, "owner", "admin")
        client = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {key}"})
        made = client.post("/v1/datasets", json={"name": "path", "label_kind": "integer", "min": 0, "max": 40,
                                                 "epsilon_total": 100.0})
        dataset = made.json()["id"]
        labels = np.random.default_rng(0).integers(0, 41, 2000)
        client.put(f"/v1/datasets/{dataset}/labels", headers={"Content-Type": "text/csv"},
                   content="example_id,label\n" + "".join(f"e{i},{v}\n" for i, v in enumerate(labels)))
        groups = "example_id,group\n" + "".join(f"e{i},g{i % 4}\n" for i in range(2000))

        def release(key: str) -> object:
            return client.post(f"/v1/datasets/{dataset}/releases", headers={"Idempotency-Key": key},
                               json={"mechanism": "opt-unbiased", "epsilon": 1.0})

        release("warm")  # imports and first-use caches outside the trace
        requests = {
            "label release (opt-unbiased)": lambda: release("traced"),
            "group release (CSV)": lambda: client.post(
                f"/v1/datasets/{dataset}/group-releases", content=groups,
                params={"mechanism": "opt-unbiased", "epsilon": 1.0, "prior_epsilon": 0.25},
                headers={"Content-Type": "text/csv", "Idempotency-Key": "groups"}),
            "release check": lambda: client.post(f"/v1/datasets/{dataset}/release-checks", json={
                "releases": [{"mechanism": "rr", "epsilon": 1.0}]}),
            "budget": lambda: client.get(f"/v1/datasets/{dataset}/budget"),
        }
        results = {name: trace(send) for name, send in requests.items()}
        ctx.close()
    if args.json:
        print(json.dumps({"bench": "request_path", "requests": results}, indent=1))
    else:
        for name, result in results.items():
            print(f"{name:32} {result['status']}  {result['modules']:3} modules  {result['edges']:3} edges  "
                  f"{result['by_package']}")


if __name__ == "__main__":
    main()
