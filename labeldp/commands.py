"""The commands that drive both parties: ``labeldp bench utility|classification|labeldp-pro`` and ``labeldp demo``.
They play the labels party and the features party at once, which is why they live above both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shared.errors import ErrorCode, LabelDPError


def register(commands) -> None:
    """The bench, demo and compose-demo commands."""
    bench = commands.add_parser("bench", help="benchmarks")
    bench_actions = bench.add_subparsers(dest="bench", required=True, parser_class=type(bench))
    _register_utility(bench_actions)
    _register_research_benches(bench_actions)
    _register_demos(commands)


def _register_utility(bench_actions) -> None:
    from labeldp.benchmarks import choices

    quick = choices.QUICK
    utility = bench_actions.add_parser(
        "utility", help="privacy-utility curves on real datasets, or on your own table (--data FILE --label COL)",
        epilog=_jobs_epilog(),
        description="The optimal-unbiased paper's privacy-utility comparison through both services, on the bundled "
        "datasets (--dataset) or on your own CSV or Parquet table (--data FILE --label COL). Columns of --data: "
        "with --features/--categorical exactly those are used; otherwise every other column is — numbers as "
        "numeric features, strings/booleans/categories as categorical — except the label, id-like columns "
        "(named id, *_id, example_id, rownames, index or 'Unnamed: N'; strings distinct on every row; integers "
        "that number the rows consecutively) and columns of other types (dates). Rows missing the label or a "
        "numeric feature are dropped. --kind is inferred (integer-valued labels: integer, else continuous). "
        "Without --clip the label bounds are the labels' own min and max (data-dependent: fine for a benchmark, "
        "not for a release); with --clip the service clips the uploaded labels and the test labels are scored "
        "after the same clip. Warnings (on stderr, and in --dry-run's plan) name categorical columns with more than "
        f"{choices.MAX_LEVELS} levels or more levels than {choices.MAX_LEVEL_SHARE:.0%} of the rows, and numeric "
        f"columns whose |correlation| with the label is {choices.LEAK_ASSOCIATION:g} or more (they may leak it); "
        "nothing is dropped because of them.")
    _data_options(utility)
    grid = choices.DEFAULT
    utility.add_argument("--epsilons", default=",".join(f"{e:g}" for e in grid.epsilons), metavar="E,E,...",
                         help="the ε grid: every private mechanism is released and trained at each (default: "
                         "%(default)s)")
    utility.add_argument("--seeds", type=int, default=grid.seeds, metavar="N",
                         help="seeds 0..N-1 per mechanism and ε (the split, the model, the release; default: "
                         "%(default)s)")
    utility.add_argument("--mechanisms", default=None, metavar="M,M,...",
                         help=f"comma list; regression: {', '.join(choices.MECHANISMS)}; class labels: "
                         f"{', '.join(choices.CLASSIFICATION_MECHANISMS)} (default: all that fit the labels)")
    utility.add_argument("--model", default=choices.DEFAULT_MODEL, metavar="M[,M]",
                         help="the learner: " + "; ".join(f"{m}: {what}" for m, what in choices.MODELS.items())
                         + "; mlp,gbdt trains both on each release (no further ε) and the summary has one table per "
                         f"learner ({', '.join(choices.NO_TREES)} is for mlp only; default: %(default)s)")
    utility.add_argument("--epochs", type=int, default=grid.epochs, metavar="N",
                         help="training epochs per MLP job (default: %(default)s)")
    utility.add_argument("--rows", type=int, default=None, metavar="N",
                         help="use N rows of each dataset drawn uniformly at random with a fixed seed (the same N "
                         "rows on every run), after rows missing the label are dropped (default: every row)")
    utility.add_argument("--out", default="bench-output/utility", metavar="DIR",
                         help="runs.csv, summary.md, datasets.json and the plots (default: %(default)s)")
    utility.add_argument("--quick", action="store_true",
                         help=f"a smoke run: {quick.seeds} seeds, ε {','.join(f'{e:g}' for e in quick.epsilons)}, "
                         f"{quick.epochs} epochs; psid-weeks only without --data")
    utility.add_argument("--dry-run", action="store_true",
                         help="print the plan (label kind and bounds, ε grid, mechanisms, seeds, features with their "
                         "types and cardinalities, left-out columns and why, warnings, number of jobs) and exit "
                         "without starting a service or training")
    utility.add_argument("--json", action="store_true", help="with --dry-run: the plan as one JSON document")
    utility.add_argument("--resume", action="store_true",
                         help="continue a run that was interrupted (Ctrl-C) in the same --out: its finished runs "
                         "(runs.csv) are kept, the others run; the other options must be the same (run.json says "
                         "what they were). The labels service starts afresh, so the remaining runs draw other noise "
                         "than an uninterrupted run would have")
    _research_options(utility)
    utility.set_defaults(handler=bench_utility_command)


def _research_options(utility) -> None:
    """``bench utility``'s options for research runs, not for choosing a mechanism."""
    utility.add_argument("--allow-uninformative", action="store_true",
                         help="research use: release even randomizers whose output does not depend on the label "
                         "(RRWithPrior keeping one class); by default the labels service releases its fallback "
                         "then, and the summary counts the fallbacks")
    utility.add_argument("--auto-candidates", metavar="M,M",
                         help="the mechanisms an auto job chooses among (its release.candidates; default the "
                         "trainer's: opt-unbiased,rr-on-bins or rr,rr-with-prior,lp-2st,alibi); rp-with-prior and "
                         "block-rr are candidates only when named")


def _data_options(utility) -> None:
    """What ``bench utility`` runs on: the bundled datasets, or a table of one's own and how to read it."""
    from labeldp.benchmarks import choices

    utility.add_argument("--dataset", default=None,
                         help=f"{', '.join(choices.DATASET_NAMES)}, a comma list, or all (default: all, unless "
                         "--data)")
    utility.add_argument("--data", default=None, metavar="FILE", help="your own table: .csv (.tsv) or .parquet")
    utility.add_argument("--label", default=None, metavar="COL", help="--data: the label column")
    utility.add_argument("--features", default=None, metavar="A,B,...",
                         help="--data: numeric feature columns (default: inferred, see above)")
    utility.add_argument("--categorical", default=None, metavar="C,D,...",
                         help="--data: categorical columns (default: inferred)")
    utility.add_argument("--kind", default=None, choices=("integer", "continuous", "finite", "classes"),
                         help="--data: the label kind (default: inferred); classes/finite with cross_entropy: "
                         "classification (RR, LP-2ST/3ST, subset, cluster priors; accuracy)")
    utility.add_argument("--clip", default=None, metavar="LOW:HIGH",
                         help="--data: declared label bounds, clipped by the labels service, e.g. -60:180 (default: "
                         "the labels' own min and max); or auto:Q_LOW:Q_HIGH:EPS[:LOW:HIGH] to choose them "
                         "privately: the labels service's DP quantiles Q_LOW and Q_HIGH of the uploaded labels on the "
                         "outer range LOW:HIGH (default: the labels' min and max), charged EPS per example on a "
                         "dataset of its own, and the summary adds EPS to each example's budget")
    utility.add_argument("--grid", type=int, default=None, metavar="N",
                         help="--data: release integer/continuous labels on a grid of N points (grid_size; default: "
                         "none for integer labels, 101 points for continuous ones)")
    utility.add_argument("--loss", default=None, choices=("squared", "poisson", "cross_entropy"),
                         help="--data: the training loss (default: squared for regression, cross_entropy for "
                         "classes)")
    utility.add_argument("--test-fraction", type=float, default=None, metavar="F",
                         help="--data: share of rows held out for scoring (default: 0.2)")


def _register_research_benches(bench_actions) -> None:
    classification = bench_actions.add_parser("classification", help="LP-1ST/2ST/3ST and subset on digits")
    classification.add_argument("--epsilons", default="0.5,1,2,4,8")
    classification.add_argument("--seeds", type=int, default=3)
    classification.add_argument("--epochs", type=int, default=40)
    classification.add_argument("--out", default="bench-output/classification")
    classification.set_defaults(handler=bench_classification_command)

    pro = bench_actions.add_parser("labeldp-pro", help="RR, LP-2ST, DP-SGD, LabelDP-Pro and PATE-FM at small ε")
    pro.add_argument("--epsilons", default="0.05,0.1,0.2,0.5,1,2")
    pro.add_argument("--seeds", type=int, default=3)
    pro.add_argument("--steps", type=int, default=300)
    pro.add_argument("--table", choices=("digits", "storm-status"), default="digits",
                     help="scikit-learn digits, or the bundled storm-status class table (test rows by storm, as "
                     "labeldp bench utility draws them)")
    pro.add_argument("--methods", metavar="M,M", help="a subset of rr, rr-with-prior, dp-sgd, labeldp-pro, pate-fm, "
                     "pate-fm-trees (default all)")
    pro.add_argument("--out", default="bench-output/labeldp-pro")
    pro.set_defaults(handler=bench_pro_command)


def _register_demos(commands) -> None:
    demo = commands.add_parser("demo", help="the two-party demo on real data (both services over HTTP)")
    demo.add_argument("--out", default="demo-output")
    demo.add_argument("--epsilons", default="0.5,1,2,4")
    demo.add_argument("--quick", action="store_true", help="fewer epochs and examples (tests)")
    demo.add_argument("--labels-url", help="a running labels party (its gateway) instead of one started here; "
                                           "with --trainer-url and --keys-file")
    demo.add_argument("--trainer-url", help="a running trainer instead of one started here")
    demo.add_argument("--keys-file", help="JSON {admin, consumer, trainer}: the office's admin key and the "
                                          "publisher's keys at both services (mode 0600, as key files are)")
    demo.set_defaults(handler=demo_command)

    stack = commands.add_parser("compose-demo", help="build and start the docker-compose stack (PostgreSQL, two "
                                                     "labels replicas, the trainer, a Spark cluster), run the demo "
                                                     "against it, tear it down (make compose-demo)")
    stack.add_argument("--out", default="compose-demo-output")
    stack.add_argument("--epsilons", default="0.5,1,2,4")
    stack.add_argument("--quick", action="store_true", help="fewer epochs and examples")
    stack.add_argument("--bases", choices=["auto", "registry", "local"], default="auto",
                       help="base images: the registry's, or built from Debian packages (default: registry if "
                            "reachable)")
    stack.add_argument("--remove-volumes", action="store_true", help="also delete the databases and keys")
    stack.set_defaults(handler=compose_demo_command)


def _jobs_epilog() -> str:
    from labeldp.benchmarks import choices

    grid = choices.DEFAULT

    def jobs(table: dict) -> str:
        private = len([m for m, fields in table.items() if fields is not None])
        return f"{grid.seeds} × {len(grid.epsilons)} × {private} = {grid.seeds * len(grid.epsilons) * private}"

    return ("Jobs: per dataset and learner, seeds × ε × private mechanisms trainer jobs (each a labels-party "
            "release and a training; a second learner trains on the same releases, but for multi-stage protocols), "
            "plus one in-process non-private model per seed and learner. With the defaults (one learner): "
            f"{jobs(choices.MECHANISMS)} jobs per regression dataset (every bundled dataset without --data), "
            f"{jobs(choices.CLASSIFICATION_MECHANISMS)} per table of class labels. --dry-run prints the exact plan.")


def _epsilons(text: str) -> list[float]:
    from shared.privacy import check_epsilon

    return [check_epsilon(e) for e in text.split(",")]


def _seeds(args) -> int:
    if args.seeds < 1:
        raise LabelDPError("--seeds must be at least 1", code=ErrorCode.USAGE)
    return args.seeds


def _models(text: str) -> tuple[str, ...]:
    from labeldp.benchmarks.choices import MODELS

    models = tuple(dict.fromkeys(m.strip() for m in text.split(",")))
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise LabelDPError(f"unknown --model {','.join(unknown) or repr(text)}; choose from {', '.join(MODELS)} or a "
                           "comma list of them", code=ErrorCode.USAGE)
    return models


def _auto_candidates(text: str | None, mechanisms: list[str] | None) -> tuple[str, ...] | None:
    from typing import get_args

    from features_party.schemas import AutoCandidate

    if text is None:
        return None
    if mechanisms is None or "auto" not in mechanisms:
        raise LabelDPError("--auto-candidates names an auto job's candidates: add auto to --mechanisms",
                           code=ErrorCode.USAGE)
    names = tuple(dict.fromkeys(m.strip() for m in text.split(",")))
    unknown = [m for m in names if m not in get_args(AutoCandidate)]
    if unknown or not names:
        raise LabelDPError(f"unknown --auto-candidates {','.join(unknown) or repr(text)}; choose from "
                           f"{', '.join(get_args(AutoCandidate))}", code=ErrorCode.USAGE)
    return names


def _print_summary(out: str) -> int:
    from pathlib import Path

    print((Path(out) / "summary.md").read_text())
    return 0


_TABLE_OPTIONS = ("label", "features", "categorical", "kind", "clip", "grid", "loss", "test_fraction")


def _table_source(args):
    """``--data`` and its options as a dataset source; every table option without ``--data`` is refused."""
    from labeldp.benchmarks.tables import TableSource, parse_clip, parse_columns

    given = [name for name in _TABLE_OPTIONS if getattr(args, name) is not None]
    if args.data is None:
        if given:
            raise LabelDPError(f"--{given[0].replace('_', '-')} applies to your own table: add --data FILE",
                               code=ErrorCode.USAGE)
        return None
    if args.dataset is not None:
        raise LabelDPError("give --data FILE or --dataset NAME, not both", code=ErrorCode.USAGE)
    if args.label is None:
        raise LabelDPError("--data needs --label COLUMN (the label column of the table)", code=ErrorCode.USAGE)
    from pathlib import Path

    source = TableSource(Path(args.data), args.label, parse_columns(args.features), parse_columns(args.categorical),
                         args.kind, parse_clip(args.clip), args.grid, args.loss,
                         0.2 if args.test_fraction is None else args.test_fraction)
    source.check_options()
    return source


def bench_utility_command(args) -> int:
    import json
    import sys

    from labeldp.benchmarks import plan
    from labeldp.benchmarks.utility import CLASSIFICATION_MECHANISMS, DATASETS, MECHANISMS, BenchConfig, run_bench

    if args.json and not args.dry_run:
        raise LabelDPError("--json applies to --dry-run (a run writes runs.csv, summary.md and datasets.json)",
                           code=ErrorCode.USAGE)
    if args.rows is not None and args.rows < 1:
        raise LabelDPError(f"--rows must be at least 1, got {args.rows}", code=ErrorCode.USAGE)
    table = _table_source(args)
    if table is not None:
        sources = [table]
    else:
        names = list(DATASETS) if args.dataset in (None, "all") else args.dataset.split(",")
        unknown = [n for n in names if n not in DATASETS]
        if unknown:
            raise LabelDPError(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)}", code=ErrorCode.USAGE)
        sources = names
    mechanisms = args.mechanisms.split(",") if args.mechanisms else None
    known = {**MECHANISMS, **CLASSIFICATION_MECHANISMS}
    if mechanisms and [m for m in mechanisms if m not in known]:
        raise LabelDPError(f"unknown mechanism; choose from {', '.join(MECHANISMS)} (regression) or "
                           f"{', '.join(m for m in CLASSIFICATION_MECHANISMS if m != 'non-private')} (classes)",
                           code=ErrorCode.USAGE)
    if args.quick:
        config = BenchConfig.quick(sources if table is not None else ["psid-weeks"], mechanisms, args.rows)
    else:
        config = BenchConfig(sources, _epsilons(args.epsilons), _seeds(args), mechanisms, args.epochs, args.rows)
    config = dataclasses.replace(config, allow_uninformative=args.allow_uninformative, models=_models(args.model),
                                 auto_candidates=_auto_candidates(args.auto_candidates, config.mechanisms))
    plans = plan.plan_bench(config)
    if args.dry_run:
        document = plan.describe(plans, config)
        print(json.dumps(document, allow_nan=False) if args.json else plan.render(document))
        return 0
    for line in plan.warning_lines(plans):
        print(f"labeldp: {line}", file=sys.stderr)
    try:
        run_bench(config, plans, args.out, resume=args.resume)
    except KeyboardInterrupt:
        print(f"labeldp: interrupted: the finished runs are in {args.out}/runs.csv; run the same command with "
              "--resume to continue", file=sys.stderr)
        return 130
    return _print_summary(args.out)


def bench_classification_command(args) -> int:
    from labeldp.benchmarks.classification import run_classification_bench

    run_classification_bench(_epsilons(args.epsilons), _seeds(args), args.out, epochs=args.epochs)
    return _print_summary(args.out)


def bench_pro_command(args) -> int:
    from labeldp.benchmarks.labeldp_pro import METHODS, run_pro_bench

    by_name = {method.split()[0]: method for method in METHODS}
    methods = None
    if args.methods:
        names = [m.strip() for m in args.methods.split(",")]
        unknown = [m for m in names if m not in by_name]
        if unknown or not names:
            raise LabelDPError(f"unknown --methods {','.join(unknown) or repr(args.methods)}; choose from "
                               f"{', '.join(by_name)}", code=ErrorCode.USAGE)
        methods = [by_name[m] for m in dict.fromkeys(names)]
    run_pro_bench(_epsilons(args.epsilons), _seeds(args), args.out, steps=args.steps, table=args.table,
                  methods=methods)
    return _print_summary(args.out)


def demo_command(args) -> int:
    from labeldp.demo import external_services, run_demo

    given = [args.labels_url, args.trainer_url, args.keys_file]
    if any(given) and not all(given):
        raise LabelDPError("--labels-url, --trainer-url and --keys-file go together", code=ErrorCode.USAGE)
    if all(given):
        run_demo(args.out, _epsilons(args.epsilons), quick=args.quick,
                 deployment=external_services(args.labels_url, args.trainer_url, args.keys_file))
    else:
        run_demo(args.out, _epsilons(args.epsilons), quick=args.quick)
    return 0


def compose_demo_command(args) -> int:
    from labeldp.compose_stack import compose_demo

    compose_demo(Path(args.out), bases=args.bases, quick=args.quick, epsilons=_epsilons(args.epsilons),
                 remove_volumes=args.remove_volumes)
    return 0
