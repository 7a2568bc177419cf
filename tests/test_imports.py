"""The module import graph has no circles, and the labels service does not load JAX until central training runs.

The graph is grimp's (what import-linter checks the layers on): every import of the four packages, including those
inside functions and under ``TYPE_CHECKING`` — an import moved into a function to break a circle still counts."""

from __future__ import annotations

import subprocess
import sys

import grimp

PACKAGES = ("labeldp", "labels_party", "features_party", "shared")


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: the graph has a few hundred nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # a cache could answer for other files
    edges = {m: {n for n in graph.find_modules_directly_imported_by(m) if n in graph.modules}
             for m in graph.modules}
    assert len(edges) > 100  # the graph is the project's, not an empty one
    assert strongly_connected(edges) == []


def test_the_labels_api_does_not_load_jax():
    code = ("import sys\nimport labels_party.http.api, labels_party.releases.kinds, labels_party.runtime.cli\n"
            "print(sorted(m for m in ('jax', 'optax', 'shared.models') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # ... and central training does load it (the check above would pass vacuously if nothing ever did).
    code = "import sys\nimport labels_party.core.labeldp_pro\nprint('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "True"
