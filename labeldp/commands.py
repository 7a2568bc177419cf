"""The commands that drive both parties: ``labeldp bench utility|classification|labeldp-pro`` and ``labeldp demo``.
They play the labels party and the features party at once, which is why they live above both."""

from __future__ import annotations

from shared.errors import LabelDPError


def register(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks")
    bench_actions = bench.add_subparsers(dest="bench", required=True, parser_class=type(bench))
    utility = bench_actions.add_parser("utility", help="privacy-utility curves on real datasets")
    utility.add_argument("--dataset", default="all", help="psid-weeks, doctor-contacts, cps-wages, or all")
    utility.add_argument("--epsilons", default="0.25,0.5,1,2,4,8")
    utility.add_argument("--seeds", type=int, default=10)
    utility.add_argument("--mechanisms", default=None, help="comma list (default: all)")
    utility.add_argument("--epochs", type=int, default=30)
    utility.add_argument("--out", default="bench-output/utility")
    utility.add_argument("--quick", action="store_true", help="2 seeds, 2 ε, 1 dataset, few epochs (CI)")
    utility.set_defaults(handler=bench_utility_command)

    classification = bench_actions.add_parser("classification", help="LP-1ST/2ST/3ST and subset on digits")
    classification.add_argument("--epsilons", default="0.5,1,2,4,8")
    classification.add_argument("--seeds", type=int, default=3)
    classification.add_argument("--epochs", type=int, default=40)
    classification.add_argument("--out", default="bench-output/classification")
    classification.set_defaults(handler=bench_classification_command)

    pro = bench_actions.add_parser("labeldp-pro", help="RR, LP-2ST, DP-SGD and LabelDP-Pro at small ε on digits")
    pro.add_argument("--epsilons", default="0.05,0.1,0.2,0.5,1,2")
    pro.add_argument("--seeds", type=int, default=3)
    pro.add_argument("--steps", type=int, default=300)
    pro.add_argument("--out", default="bench-output/labeldp-pro")
    pro.set_defaults(handler=bench_pro_command)


    demo = commands.add_parser("demo", help="the two-party demo on real data (both services over HTTP)")
    demo.add_argument("--out", default="demo-output")
    demo.add_argument("--epsilons", default="0.5,1,2,4")
    demo.add_argument("--quick", action="store_true", help="fewer epochs and examples (tests)")
    demo.set_defaults(handler=demo_command)


def _epsilons(text: str) -> list[float]:
    from shared.privacy import check_epsilon

    return [check_epsilon(e) for e in text.split(",")]


def _seeds(args) -> int:
    if args.seeds < 1:
        raise LabelDPError("--seeds must be at least 1", code="usage")
    return args.seeds


def _print_summary(out: str) -> int:
    from pathlib import Path

    print((Path(out) / "summary.md").read_text())
    return 0


def bench_utility_command(args) -> int:
    from labeldp.benchmarks.utility import DATASETS, MECHANISMS, BenchConfig, run_bench

    names = list(DATASETS) if args.dataset == "all" else args.dataset.split(",")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise LabelDPError(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)}", code="usage")
    mechanisms = args.mechanisms.split(",") if args.mechanisms else list(MECHANISMS)
    if [m for m in mechanisms if m not in MECHANISMS]:
        raise LabelDPError(f"unknown mechanism; choose from {', '.join(MECHANISMS)}", code="usage")
    config = BenchConfig(names, _epsilons(args.epsilons), _seeds(args), mechanisms, args.epochs)
    if args.quick:
        config = BenchConfig(["psid-weeks"], [1.0, 2.0], 2, mechanisms, epochs=8)
    run_bench(config, args.out)
    return _print_summary(args.out)


def bench_classification_command(args) -> int:
    from labeldp.benchmarks.classification import run_classification_bench

    run_classification_bench(_epsilons(args.epsilons), _seeds(args), args.out, epochs=args.epochs)
    return _print_summary(args.out)


def bench_pro_command(args) -> int:
    from labeldp.benchmarks.labeldp_pro import run_pro_bench

    run_pro_bench(_epsilons(args.epsilons), _seeds(args), args.out, steps=args.steps)
    return _print_summary(args.out)


def demo_command(args) -> int:
    from labeldp.demo import run_demo

    run_demo(args.out, _epsilons(args.epsilons), quick=args.quick)
    return 0
