"""The labels-party HTTP API (FastAPI): the routers of :mod:`labels_party.http.routers` (thin, over
:mod:`labels_party.releases.datasets`, :mod:`labels_party.releases` and :mod:`labels_party.http.audit`) behind the
gatekeeper.

Every route under ``/v1`` is guarded *before any body is read*: each declares its guard
(:mod:`labels_party.http.access`) and the gatekeeper (:mod:`shared.service.gate`) authenticates the key (401), checks
that it may see the dataset a path names (404, the same as for a dataset that does not exist) and that it may administer
it where the guard says so (403), and only then lets the route read a body — limited by the guard (413) and, for
columnar bodies, streamed to disk and hashed on the way. Errors are always JSON ``{"error": {"code", "message"}}`` with
a 4xx status documented in the OpenAPI; unexpected failures answer 500 with no stack trace.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from labels_party.http import access
from labels_party.http.console.app import create_console
from labels_party.http.routers import audit, datasets, mechanisms, releases
from labels_party.runtime.context import ServiceContext
from labels_party.store.migrations import MIGRATIONS
from shared.service.app import service_app
from shared.service.health import readiness_checks
from shared.service.leases import serving

log = logging.getLogger("labeldp.labels")


def create_app(ctx: ServiceContext, *, run_jobs: bool = False) -> FastAPI:
    """The HTTP API on ``ctx``; with ``run_jobs`` (``serve``) it runs this process's job workers (``ctx.jobs``) while
    it serves, and ``/readyz`` checks they are alive (tests run jobs with ``ctx.jobs.run_pending()``)."""
    extra = {"job_workers": ctx.jobs.alive} if run_jobs else {}
    app = service_app("labeldp labels party", ctx, admit=access.admitter(ctx.sessions, ctx.settings, ctx.ledger),
                      guard_type=access.Access,
                      routers=(datasets.router, releases.router, mechanisms.router, audit.router), log=log,
                      lifespan=serving(ctx.jobs if run_jobs else None),
                      readiness=readiness_checks(ctx.sessions.kw["bind"], MIGRATIONS.head(), extra_checks=extra),
                      adjust_openapi=lambda spec: _deployment(spec, ctx.settings),
                      private_dirs=(ctx.settings.data_dir,))
    # The owner's console (HTML for admin keys, its own gate and session cookies; not part of the OpenAPI).
    app.mount("/console", create_console(ctx))
    return app


def _deployment(spec: dict, settings) -> None:
    """This deployment's ε range, request limits and release quotas in the OpenAPI."""
    _epsilon_range(spec, settings)
    _request_limits(spec, settings)
    spec["info"]["description"] = " ".join(filter(None, (spec["info"].get("description"), settings.describe())))


def _epsilon_range(spec: dict, settings) -> None:
    """This deployment's ε range on every ε a request carries (schemas and query parameters), and its δ ceiling on
    every δ a budget or grant carries, so generated clients and fuzzers know them."""
    low, high = settings.epsilon_min, settings.epsilon_max
    for model in _release_request_models(spec):  # what they take, never what they answer
        for name, prop in spec["components"]["schemas"][model].get("properties", {}).items():
            if name in ("epsilon", "prior_epsilon"):
                for option in prop.get("anyOf", [prop]):
                    if option.get("type") == "number":
                        option.update(minimum=low, maximum=high)
    schemas = spec["components"]["schemas"]
    for model in ("ClassesDatasetCreate", "ContinuousDatasetCreate", "FiniteDatasetCreate", "IntegerDatasetCreate"):
        total = schemas[model]["properties"]["epsilon_total"]  # a budget below the smallest release buys nothing
        total.pop("exclusiveMinimum", None)
        total["minimum"] = low
        schemas[model]["properties"]["delta_total"].update(maximum=settings.delta_max)
    schemas["GrantCreate"]["properties"]["delta"].update(maximum=settings.delta_max)
    for path in spec["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] in ("epsilon", "prior_epsilon"):
                    parameter["schema"].update(minimum=low, maximum=high)


RELEASE_ANSWERS = {"#/components/schemas/Release", "#/components/schemas/ReleaseChecked"}


def _release_request_models(spec: dict) -> set[str]:
    """The component schemas that the bodies of routes answering a release (or a release check) name, and those
    their properties name: every request whose ε is a release's, and no other (a grant's ε is an allocation)."""
    schemas, found = spec["components"]["schemas"], set()
    pending = [content["schema"] for path in spec["paths"].values() for operation in path.values()
               if RELEASE_ANSWERS & {answer.get("schema", {}).get("$ref") for response in operation["responses"]
                                     .values() for answer in response.get("content", {}).values()}
               for content in operation.get("requestBody", {}).get("content", {}).values() if "schema" in content]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.rsplit("/", 1)[-1] if ref.startswith("#/components/schemas/") else None
            if name is not None and name not in found:
                found.add(name)
                pending.append(schemas[name])
            pending.extend(value for key, value in node.items() if key != "$ref")
        elif isinstance(node, list):
            pending.extend(node)
    return found


def _request_limits(spec: dict, settings) -> None:
    """This deployment's per-request limits in the description of the routes they refuse (before any charge)."""
    documents = (f"A request whose mechanism document could exceed {settings.max_document_bytes:,} bytes (predicted "
                 "from public inputs: labels, outputs, groups, model size) is refused with 400 document_too_large "
                 "before anything is computed or charged.")
    groups = (f"At most {settings.max_groups_per_release:,} groups per request (400 too_many_groups, before the "
              "charge).")
    training = (f"A training whose work, steps × (padded batch + the denoiser's rows) × model parameters, is above "
                f"{settings.max_central_training_size:,}, or one step's above {settings.max_central_training_step:,} "
                "(from public inputs: steps, batch size, denoiser, example count, feature count, hidden sizes, "
                "classes), is refused with 400 training_too_large before anything is computed or charged.")
    for path, item in spec["paths"].items():
        for operation in item.values():
            if path.endswith(("/releases", "/central-trainings", "/pate-releases")) and operation.get(
                    "operationId", "").startswith("create"):
                operation["description"] = f"{operation.get('description', '')}\n\n{documents}".strip()
            if path.endswith(("/central-trainings", "/pate-releases")) and operation.get("operationId", "").startswith(
                    "create"):
                operation["description"] = f"{operation['description']}\n\n{training}"
            if path.endswith("/group-releases"):
                operation["description"] = f"{operation.get('description', '')}\n\n{groups} {documents}".strip()
