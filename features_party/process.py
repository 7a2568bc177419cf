"""A trainer process's context with its job workers: built here, above both the context and the jobs module (which
works on the context), so that neither imports the other."""

from __future__ import annotations

from features_party.context import TrainerContext, build_context
from features_party.jobs import make_runner
from features_party.settings import TrainerSettings


def make_context(settings: TrainerSettings | None = None, *, upgrade: bool = False) -> TrainerContext:
    ctx = build_context(settings, upgrade=upgrade)
    object.__setattr__(ctx, "jobs", make_runner(ctx))  # frozen: bound once, here, before anyone uses the context
    return ctx
