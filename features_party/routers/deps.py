"""What the trainer's routers share: the admissions their guards declare (:mod:`features_party.access`) and the
context."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from features_party import access
from features_party.access import Admission
from features_party.context import TrainerContext
from shared.service import dependencies

AnyKey = Annotated[Admission, Depends(access.ANY_KEY)]
UploadsFeatures = Annotated[Admission, Depends(access.UPLOAD_FEATURES)]
Context = Annotated[TrainerContext, Depends(dependencies.context)]
