"""Mechanism documents: content-addressed public descriptions of what releases used."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from labels_party.http.routers.deps import AnyKey, Context
from labels_party.ledger import documents
from labels_party.releases import queries
from shared.service.gate import GuardedRoute

router = APIRouter(tags=["mechanisms"], route_class=GuardedRoute)


@router.get("/v1/mechanisms/{mechanism_hash}", responses={200: {
    "description": "the document, as JSON or (by Accept) in its packed binary form",
    "content": {"application/json": {"schema": {"type": "object"}},
                documents.BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
def mechanism_document(mechanism_hash: str, request: Request, who: AnyKey, ctx: Context):
    """The full public description a release references (``mechanism_hash``, the SHA-256 of the document's
    canonical JSON): output values, exact probabilities, the noisy prior, the certified ε, model parameters. JSON,
    or with ``Accept: application/vnd.labeldp.mechanism+npz`` the form it is stored in: an ``.npz`` (zip) whose
    ``document.json`` is the document with each numeric list replaced by ``{"$array": i}`` and whose ``a{i}.npy``
    are those lists as int64 or float64 arrays, each distinct one once."""
    packed, unpacked = queries.get_mechanism_document(ctx, who.principal, mechanism_hash)
    if documents.BINARY_MEDIA_TYPE in (request.headers.get("accept") or ""):
        return Response(packed, media_type=documents.BINARY_MEDIA_TYPE)
    return JSONResponse(unpacked)
