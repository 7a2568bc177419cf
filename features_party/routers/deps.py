"""What the trainer's routers share: the admissions their guards declare (:mod:`features_party.access`) and the
context."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from features_party import access
from features_party.access import Admission
from features_party.context import TrainerContext
from shared.errors import ErrorCode, LabelDPError
from shared.service import dependencies

AnyKey = Annotated[Admission, Depends(access.ANY_KEY)]
UploadsFeatures = Annotated[Admission, Depends(access.UPLOAD_FEATURES)]
UploadsIdList = Annotated[Admission, Depends(access.UPLOAD_ID_LIST)]
Context = Annotated[TrainerContext, Depends(dependencies.context)]

# The OpenAPI of a route whose body is a CSV file (features tables, id lists), streamed to disk, not parsed by FastAPI
CSV_BODY = {"requestBody": {"required": True, "content": {"text/csv": {"schema": {"type": "string",
                                                                                 "format": "binary"}}}}}


def require_csv(request: Request, what: str) -> None:
    """415 unless the body is declared ``text/csv``."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != "text/csv":
        raise LabelDPError(f"{what} are uploaded as text/csv, not {media or '(none)'!r}",
                           code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
