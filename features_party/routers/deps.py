"""What the trainer's routers share: the principal and the context."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from features_party.auth import Principal
from features_party.context import TrainerContext
from shared.service import dependencies

Auth = Annotated[Principal, Depends(dependencies.principal)]
Context = Annotated[TrainerContext, Depends(dependencies.context)]
