"""The plan of ``labeldp bench utility`` before anything is trained, and what ``--dry-run`` prints of it.

:func:`plan_bench` prepares every dataset (reads the table, infers its columns and label kind, draws ``--rows``)
and refuses what the services would refuse (:func:`~labeldp.benchmarks.utility.preflight`) — before any server
starts. :func:`describe` is the plan as one JSON-able document: per dataset the label kind, clip bounds (with
``--clip auto``: the outer range and the quantiles the clip will come from) and grid, the ε grid, mechanisms and
seeds, the features with their types and cardinalities, the columns left out and why, and the number of trainer
jobs (seeds × ε × private mechanisms × learners; the non-private model trains in process, once per
seed and learner). :func:`render` is the same for a terminal.

Warnings name columns that look wrong for a benchmark; nothing is dropped because of them (the user decides, with
``--features``/``--categorical``):

* **High cardinality**: a categorical column with more than ``MAX_LEVELS`` (1000) levels, or with more levels than
  ``MAX_LEVEL_SHARE`` (5%) of the rows — fewer than 20 rows per level on average, so most levels' embeddings learn
  little and an identifier-like code (an aircraft's tail number) lets the model memorize rows.
* **Suspected leak**: a numeric column whose association with the label (as scored: clipped) is at least
  ``LEAK_ASSOCIATION`` (0.95): |Pearson r| for numeric labels; for classes the correlation ratio η (the share of
  the column's spread the classes explain, square-rooted). Such a column is usually computed from the label or
  observed after it (the arrival time for an arrival-delay label): a model that uses it says little about what
  privacy costs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from labeldp.benchmarks.choices import LEAK_ASSOCIATION, MAX_LEVEL_SHARE, MAX_LEVELS
from labeldp.benchmarks.tables import MIN_TEST_ROWS, MIN_TRAIN_ROWS
from labeldp.benchmarks.utility import (
    RAW,
    ROWS_SEED,
    TRUTH,
    BenchConfig,
    Prepared,
    _split,
    mechanisms_for,
    preflight,
    runs_of,
)
from shared.errors import ErrorCode, LabelDPError


class DatasetPlan(NamedTuple):
    prepared: Prepared
    mechanisms: list[str]


def plan_bench(config: BenchConfig) -> list[DatasetPlan]:
    plans = []
    for source in config.sources():
        prepared = source.prepare().sample(config.max_examples)
        if config.max_examples is not None:
            _check_rows(prepared, config.max_examples)
        mechanisms = config.mechanisms_of(prepared)
        preflight(prepared, mechanisms, config.auto_candidates)
        plans.append(DatasetPlan(prepared, mechanisms))
    return plans


def _check_rows(prepared: Prepared, rows: int) -> None:
    train, test = _split(prepared.frame, prepared, 0)
    if len(test) < MIN_TEST_ROWS or len(train) < MIN_TRAIN_ROWS:
        raise LabelDPError(f"--rows {rows}: {prepared.name} would have {len(train)} training and {len(test)} test "
                           f"rows; the bench needs at least {MIN_TRAIN_ROWS} and {MIN_TEST_ROWS}", code=ErrorCode.USAGE)


def _jobs(plan: DatasetPlan, config: BenchConfig) -> tuple[int, int]:
    """(trainer jobs, in-process non-private models): the runs the bench will make (each cell once per learner),
    counted, not re-derived."""
    runs = runs_of(plan.mechanisms, config)
    private = [mechanism for mechanism, _, _ in runs if mechanisms_for(plan.prepared)[mechanism] is not None]
    return sum(len(config.learners_of(m)) for m in private), (len(runs) - len(private)) * len(config.models)


def column_warnings(prepared: Prepared) -> list[dict]:
    """The module docstring's warnings for one dataset, in column order."""
    frame, rows = prepared.frame, len(prepared.frame)
    found = []
    level_limit = min(MAX_LEVELS, MAX_LEVEL_SHARE * rows)
    for column in prepared.categorical:
        levels = int(frame[column].nunique(dropna=False))
        if levels > level_limit:
            found.append({"column": column, "warning": "high_cardinality", "value": levels,
                          "message": f"categorical column {column!r} has {levels} levels for {rows} rows (more than "
                                     f"{MAX_LEVELS} or {MAX_LEVEL_SHARE:.0%} of the rows): few rows per level, "
                                     "likely an identifier; leave it out with --features/--categorical"})
    labels = frame[TRUTH].to_numpy(dtype=float)
    for column in prepared.numeric:
        association = _association(frame[column].to_numpy(dtype=float), labels, prepared.classification)
        if association >= LEAK_ASSOCIATION:
            what = "correlation ratio η" if prepared.classification else "|correlation|"
            found.append({"column": column, "warning": "suspected_leak", "value": round(association, 4),
                          "message": f"numeric column {column!r} has {what} {association:.3f} with the label "
                                     f"(≥ {LEAK_ASSOCIATION:g}): it may be computed from the label or observed "
                                     "after it; leave it out with --features/--categorical"})
    found += _range_warnings(prepared)
    return found


def _range_warnings(prepared: Prepared) -> list[dict]:
    """The declared range (or, with a private clip, the outer range) far wider than the labels' middle 90 %: the
    labels service's own rule (:func:`labels_party.releases.datasets.range_warning`), on the raw labels the bench
    holds."""
    from labels_party.releases.datasets import WIDE_RANGE

    clip = prepared.domain.get("clip")
    if prepared.classification or clip is None:
        return []
    raw = prepared.frame[RAW].to_numpy(dtype=float)
    low, high = np.quantile(raw, [0.05, 0.95])
    span = clip["high"] - clip["low"]
    if span <= WIDE_RANGE * (high - low):
        return []
    remedy = ("the clip is chosen privately within it" if prepared.clip_choice is not None
              else "declare a narrower --clip, or --clip auto:0.01:0.99:EPS to choose one privately")
    return [{"column": prepared.info.get("label", "label"), "warning": "wide_range",
             "value": round(span / max(high - low, 1e-300), 1),
             "message": f"the declared label range [{clip['low']:g}, {clip['high']:g}] is "
                        f"{span / max(high - low, 1e-300):,.0f} times wider than the labels' middle 90 % "
                        f"([{low:.4g}, {high:.4g}]): noise calibrated to the range swamps them; {remedy}"}]


def _association(values: np.ndarray, labels: np.ndarray, classes: bool) -> float:
    """|Pearson r| (numeric labels) or the correlation ratio η (classes); 0 for a constant column."""
    spread = values.var()
    if not spread > 0 or not labels.var() > 0:
        return 0.0
    if classes:
        class_means = pd.Series(values).groupby(labels).transform("mean").to_numpy()
        return float(math.sqrt(class_means.var() / spread))
    return float(abs(np.corrcoef(values, labels)[0, 1]))


def _left_out(prepared: Prepared) -> dict[str, str]:
    """Every column of the dataset's table that is neither a feature nor the label, with the reason."""
    told = prepared.info.get("ignored_columns", {})
    used = {*prepared.numeric, *prepared.categorical, RAW, TRUTH, "example_id", prepared.info.get("label")}
    reasons = {}
    for column in prepared.frame.columns:
        if column == prepared.group:
            reasons[column] = "splits train and test (repeated individuals), not a feature"
        elif column not in used:
            reasons[column] = told.get(column, "not in the bundled dataset's column list")
    return reasons


def describe(plans: list[DatasetPlan], config: BenchConfig) -> dict:
    datasets = [_describe_one(plan, config) for plan in plans]
    return {"models": list(config.models), "epsilons": list(config.epsilons), "seeds": config.seeds,
            "epochs": config.epochs,
            "rows": config.max_examples, "rows_seed": ROWS_SEED if config.max_examples is not None else None,
            "jobs": sum(d["jobs"] for d in datasets),
            "non_private_models": sum(d["non_private_models"] for d in datasets), "datasets": datasets}


def _describe_one(plan: DatasetPlan, config: BenchConfig) -> dict:
    prepared = plan.prepared
    frame = prepared.frame
    jobs, non_private = _jobs(plan, config)
    features = ([{"name": c, "type": "numeric", "distinct": int(frame[c].nunique())} for c in prepared.numeric]
                + [{"name": c, "type": "categorical", "levels": int(frame[c].nunique(dropna=False))}
                   for c in prepared.categorical])
    private = [m for m in plan.mechanisms if mechanisms_for(prepared)[m] is not None]
    learners = f" × {len(config.models)} learners" if len(config.models) > 1 else ""
    return {"name": prepared.name, "description": prepared.description, "source": prepared.info.get("source"),
            "label": prepared.info.get("label"), "label_kind": prepared.domain["label_kind"],
            "clip": prepared.domain.get("clip"), "grid_size": prepared.domain.get("grid_size"),
            "private_clip": prepared.clip_choice.describe() if prepared.clip_choice is not None else None,
            "num_classes": prepared.domain.get("num_classes"), "loss": prepared.loss, "metric": prepared.metric,
            "rows": len(frame), "dropped_rows": prepared.info.get("dropped_rows", 0),
            "test_fraction": prepared.test_fraction, "group": prepared.group, "mechanisms": plan.mechanisms,
            "jobs": jobs, "jobs_formula": f"{config.seeds} seeds × {len(config.epsilons)} ε × {len(private)} "
                                          f"private mechanisms{learners}",
            "releases": config.seeds * len(config.epsilons) * sum(config.releases_per_cell(prepared, m)
                                                                   for m in plan.mechanisms),
            "non_private_models": non_private, "features": features, "left_out": _left_out(prepared),
            "warnings": column_warnings(prepared)}


def warning_lines(plans: list[DatasetPlan]) -> list[str]:
    return [f"warning: {plan.prepared.name}: {w['message']}" for plan in plans
            for w in column_warnings(plan.prepared)]


def render(plan: dict) -> str:
    epsilons = ", ".join(f"{e:g}" for e in plan["epsilons"])
    rows = "all" if plan["rows"] is None else f"at most {plan['rows']} per dataset (seeded draw)"
    lines = [f"Plan: {plan['jobs']} trainer jobs and {plan['non_private_models']} non-private models (in process) "
             f"over {len(plan['datasets'])} dataset(s); nothing has been trained.",
             f"learners: {', '.join(plan['models'])}; ε: {epsilons}; seeds: {plan['seeds']}; epochs (MLP): "
             f"{plan['epochs']}; rows: {rows}."]
    for d in plan["datasets"]:
        chosen = d["private_clip"]
        bounds = (f", clip [{d['clip']['low']:g}, {d['clip']['high']:g}]" if d["clip"] and not chosen else "") + \
            (f", outer range [{d['clip']['low']:g}, {d['clip']['high']:g}], clip from its DP "
             f"{chosen['quantiles'][0]:g} and {chosen['quantiles'][1]:g} quantiles at ε = {chosen['epsilon']:g}"
             if chosen else "") + \
            (f", grid {d['grid_size']}" if d["grid_size"] else "") + \
            (f", {d['num_classes']} classes" if d["num_classes"] else "")
        lines += ["", f"{d['name']}: {d['description']}",
                  f"  rows: {d['rows']} ({d['dropped_rows']} dropped for a missing label or numeric feature); "
                  f"test fraction {d['test_fraction']:g}" + (f", split by {d['group']}" if d["group"] else ""),
                  f"  label: {d['label']} ({d['label_kind']}{bounds}); loss {d['loss']}; metric {d['metric']}",
                  f"  mechanisms: {', '.join(d['mechanisms'])}",
                  f"  jobs: {d['jobs_formula']} = {d['jobs']} ({d['releases']} releases); non-private models: "
                  f"{d['non_private_models']}",
                  "  features:"]
        for f in d["features"]:
            size = f"{f['levels']} levels" if f["type"] == "categorical" else f"{f['distinct']} distinct values"
            lines.append(f"    {f['name']}: {f['type']}, {size}")
        if d["left_out"]:
            lines += ["  left out:", *[f"    {c}: {why}" for c, why in d["left_out"].items()]]
        if d["warnings"]:
            lines += ["  warnings:", *[f"    {w['message']}" for w in d["warnings"]]]
    return "\n".join(lines)
