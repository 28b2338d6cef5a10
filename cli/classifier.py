"""`forerun classifier train|cv`: fit and cross-validate the ε-certainty classifier (PreSTO App. E.7).

    forerun classifier train --records FILE... --out PATH [--features cut_fraction,...] [--json]
    forerun classifier cv    --records FILE... [--folds 5] [--features ...] [--no-group] [--json]
    forerun classifier ceiling --records FILE... [--npf 20] [--classifier PATH] [--sampler presto-power-mh] [--json]

Records are the JSONL scored-node lines the PreSTO samplers write (programs/records.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from ..classifiers.ceiling import ceiling, format_ceiling, recorded_rounds
from ..classifiers.certainty import CertaintyClassifier, CertaintyConfig
from ..classifiers.cross_validation import cross_validate_certainty, format_cv_table
from ..classifiers.features import FEATURE_SETS, SAMPLER_FEATURES, drop_unreachable
from ..classifiers import shipped
from ..programs.acceptance import EPSILON as DEFAULT_EPSILON
from ..programs.records import NodeRecord, read_node_records
from .args import comma_items, fold_count, fold_seed_int, input_path, positive_int
from .config_flags import flags_named
from .errors import CommandError, one_line, reports_errors
from .inputs import naming_undecodable
from .output import bars_enabled, output_file, print_json

__all__ = ["register", "train_command", "cv_command", "ceiling_command", "classifier_file", "classifier_from_args",
           "warn_shipped"]


def _features(text: str) -> tuple[str, ...]:
    if text in FEATURE_SETS:
        return FEATURE_SETS[text]
    names = tuple(comma_items(text))
    unknown = unknown_to_samplers(names)
    if unknown:
        raise argparse.ArgumentTypeError(unknown)
    return names


def unknown_to_samplers(features: Any) -> str:
    """Why a classifier with `features` cannot drive the samplers ("" when it can): a feature they do not know
    before a candidate's request (a record field such as block or node_id, or one known only after it)."""
    unknown = [f for f in features if f not in SAMPLER_FEATURES]
    if not unknown:
        return ""
    return (f"feature(s) {', '.join(unknown)} are not known to the samplers before a candidate's request (usable: "
            f"{', '.join(sorted(SAMPLER_FEATURES))})")


def classifier_file(path: str) -> CertaintyClassifier:
    """A --classifier JSON file (a bad or unreadable file, or one the samplers cannot feed: one line naming it)."""
    with naming_undecodable([path], "--classifier"):
        model = CertaintyClassifier.load(path)
    unknown = unknown_to_samplers(model.config.features)
    if unknown:
        raise CommandError(f"--classifier {path}: {unknown}")
    return model


def classifier_from_args(args: argparse.Namespace) -> CertaintyClassifier:
    """--classifier FILE, or without it the shipped classifier (`classifiers.shipped`, kept in args.shipped)."""
    if not args.classifier:
        args.shipped = getattr(args, "shipped", None) or shipped.load_shipped()
        return args.shipped.classifier
    return classifier_file(args.classifier)


def warn_shipped(command: str, args: argparse.Namespace, model: str | None, samplers: Any) -> None:
    """One stderr line when the shipped classifier runs on a model or sampler it was not trained on."""
    loaded = getattr(args, "shipped", None)
    if loaded is not None:
        note = shipped.mismatch_note(loaded, model, samplers)
        if note:
            print(f"forerun {command}: warning: {note}", file=sys.stderr)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", nargs="+", type=input_path, required=True, metavar="FILE",
                   help="JSONL scored-node records")
    p.add_argument(
        "--features",
        type=_features,
        default=("cut_fraction",),
        help="comma-separated feature names, or a feature set of App. E.7 "
        f"({', '.join(FEATURE_SETS)}); default: cut_fraction",
    )
    p.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help=f"recompute each label from accept_prob with this ε (default: use the recorded certainty_class, ε = {DEFAULT_EPSILON})",
    )
    p.add_argument(
        "--sampler",
        default=None,
        help="use only records whose 'sampler' field equals this (e.g. presto-power-mh); E.7 fits one model per sampler",
    )
    p.add_argument(
        "--drop-unreachable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drop scored nodes below an unexpanded node of the same call (requests BFS placed below a deferred "
        "node, which the walk cannot reach): the paper's training data (App. E.7), on by default; "
        "--no-drop-unreachable keeps them",
    )
    p.add_argument("--l2-penalty", type=float, default=1.0, help="λ of the L2 penalty (scikit-learn C = 1/λ); default 1")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def register(subparsers: Any, bench_subparsers: Any) -> None:
    """Add `forerun classifier train|cv` (no benchmarks in this area)."""
    del bench_subparsers
    parser = subparsers.add_parser("classifier", help="ε-certainty classifier of the predictive traversal rule")
    sub = parser.add_subparsers(dest="classifier_command", required=True)

    train = sub.add_parser("train", help="fit the classifier on scored-node records and save it as JSON")
    _add_common(train)
    train.add_argument("--out", required=True, metavar="PATH", help="where to write the model JSON")
    train.add_argument(
        "--allow-missing-classes",
        action="store_true",
        help="fit even if a certainty class is absent from the records (it gets probability 0)",
    )
    train.set_defaults(handler=train_command)

    cv = sub.add_parser("cv", help="cross-validate the classifier against constant baselines (App. E.7)")
    _add_common(cv)
    cv.add_argument("--folds", type=fold_count, default=5, help="number of folds, >= 2 (default 5)")
    cv.add_argument("--seed", type=fold_seed_int, default=0, help="fold shuffling seed, below 2**32 (default 0)")
    cv.add_argument(
        "--no-group",
        action="store_true",
        help="split nodes with StratifiedKFold instead of holding out whole prompts",
    )
    cv.set_defaults(handler=cv_command)

    top = sub.add_parser("ceiling", help="on BFS records, the expected transitions per call of BFS, the predictive "
                                         "rule and an oracle that knows every A: the most any classifier could gain")
    top.add_argument("--records", nargs="+", type=input_path, required=True, metavar="FILE",
                     help="JSONL scored-node records of round-based BFS (`bench presto --traversals bfs --records`)")
    top.add_argument("--npf", type=positive_int, default=20, help="the budget N_pf in scored nodes (default 20)")
    top.add_argument("--classifier", type=input_path, default=None,
                     help="certainty classifier JSON for the predictive rule (default: the shipped one)")
    top.add_argument("--sampler", default="presto-power-mh",
                     help="records of this sampler only (default presto-power-mh)")
    top.add_argument("--json", action="store_true", help="print JSON on stdout")
    top.set_defaults(handler=ceiling_command)


def _config(args: argparse.Namespace, *, allow_missing: bool = False) -> CertaintyConfig:
    with flags_named(args, CertaintyConfig, allow_missing_classes="allow_missing_classes"):
        return CertaintyConfig(
            epsilon=DEFAULT_EPSILON if args.epsilon is None else args.epsilon,
            features=args.features,
            l2_penalty=args.l2_penalty,
            allow_missing_classes=allow_missing,
        )


def _of_sampler(records: list[NodeRecord], sampler: str) -> list[NodeRecord]:
    """The records of `sampler`; ValueError naming the samplers the file holds when none is."""
    kept = [r for r in records if r.sampler == sampler]
    if not kept:
        found = sorted({str(r.sampler) for r in records if r.sampler is not None})
        unnamed = " (and records with no sampler)" if any(r.sampler is None for r in records) else ""
        raise ValueError(f"no records with sampler {sampler!r} (samplers found: {', '.join(found) or 'none'}"
                         f"{unnamed})")
    return kept


def _read(args: argparse.Namespace) -> tuple[list[NodeRecord], int, int]:
    """Records from --records (filtered by --sampler, each node once), how many --drop-unreachable removed and how
    many duplicates were dropped."""
    with naming_undecodable(args.records, "--records"):
        records = read_node_records(args.records, epsilon=args.epsilon, warn=_warn)
    if args.sampler is not None:
        records = _of_sampler(records, args.sampler)
    _warn_bounds(records)
    kept = drop_unreachable(records) if args.drop_unreachable else records  # reachability: per traversal's call
    unique, duplicates = _unique(kept)
    return unique, len(records) - len(kept), duplicates


def _unique(records: list[NodeRecord]) -> tuple[list[NodeRecord], int]:
    """Each record once (the first), and how many identical copies were dropped: a file passed twice, or the
    bfs and predictive variants of `bench presto --traversals bfs predictive` scoring the same node of the same
    round.  A copy would weigh the node twice in the fit and, with --no-group, sit in the training fold of its
    own test node.  The traversal is not part of the comparison: both variants' copies are one example."""
    seen: set[str] = set()
    kept = []
    for r in records:
        key = json.dumps({k: v for k, v in r.to_json().items() if k != "traversal"}, sort_keys=True, default=repr)
        if key not in seen:
            seen.add(key)
            kept.append(r)
    return kept, len(records) - len(kept)


def _warn(message: str) -> None:
    """One warning line on stderr (a torn records line skipped, early rejections' bounds)."""
    print(f"forerun classifier: warning: {message}", file=sys.stderr)


def _warn_bounds(records: list[NodeRecord]) -> None:
    """One stderr line when records carry an upper bound of log A instead of its value: streaming PreSTO's early
    rejections (extra.log_accept_is_bound), whose proposals were never decoded to the end."""
    bounds = sum(bool(r.extra.get("log_accept_is_bound")) for r in records)
    if bounds:
        _warn(f"{bounds} of {len(records)} records are early rejections whose log A is an upper bound "
              "(extra.log_accept_is_bound): their accept_prob reads high and their certainty class may read uncertain "
              "where the exact one is a certain rejection; train on records with --no-early-reject or round-based "
              "PreSTO for exact labels")


@reports_errors("classifier train")
def train_command(args: argparse.Namespace) -> int:
    # bad input raises ValueError: one line on stderr, exit 2 (cli/errors.py)
    out = output_file(args.out, "--out", inputs={"--records": args.records})
    config = _config(args, allow_missing=args.allow_missing_classes)
    records, dropped, duplicates = _read(args)
    model = CertaintyClassifier(config).fit(records)
    try:
        path = model.save(out)
    except OSError as exc:  # a full disk: was '[Errno 28] No space left on device', naming no file
        failure = OSError(f"--out {out}: the classifier was not written whole ({exc.strerror or exc})")
        failure.errno = exc.errno  # a write failure (exit 1), not bad input
        raise failure from exc
    summary = {
        "out": str(path),
        "training_size": model.training_size,
        "class_counts": model.class_counts,
        "features": list(model.features),
        "dropped_unreachable": dropped,
        "dropped_duplicates": duplicates,
        "branch_prob_accept_at": {
            f"{cf:.2f}": float(h)
            for cf, h in zip((0.0, 0.25, 0.5, 0.75, 1.0), _branch_grid(model))
        }
        if model.features == ("cut_fraction",)
        else None,
    }
    if args.json:
        undefined = {} if summary["branch_prob_accept_at"] is not None else {"undefined": {"branch_prob_accept_at":
                     "the model has features besides cut_fraction: ĥ(v+) is not a function of c/T alone"}}
        print_json({**summary, "model": model.to_dict(), **undefined}, indent=2)
    else:
        counts = ", ".join(f"{c} {n}" for c, n in model.class_counts.items())
        if args.drop_unreachable:
            print(f"dropped {dropped} unreachable records")
        if duplicates:
            print(f"dropped {duplicates} duplicate records")
        print(f"trained on {model.training_size} records ({counts}); features: {', '.join(model.features)}")
        if summary["branch_prob_accept_at"] is not None:
            grid = "  ".join(f"c/T={k}: {v:.3f}" for k, v in summary["branch_prob_accept_at"].items())
            print(f"ĥ(v+) {grid}")
        print(f"wrote {path}")
    return 0


def _branch_grid(model: CertaintyClassifier) -> list[float]:
    return [float(h) for h in model.branch_prob_accept_many([0.0, 0.25, 0.5, 0.75, 1.0])]


@reports_errors("classifier cv")
def cv_command(args: argparse.Namespace) -> int:
    config = _config(args)
    records, dropped, duplicates = _read(args)
    with warnings.catch_warnings(record=True) as caught:  # scikit-learn's were two raw lines (its file and source)
        warnings.simplefilter("always")
        report = cross_validate_certainty(records, config, folds=args.folds, seed=args.seed,
                                          group_by_prompt=not args.no_group, progress=bars_enabled())
    for message in dict.fromkeys(one_line(w.message) for w in caught):  # each once, on one line
        _warn(message)
    if args.json:
        print_json({**report.to_dict(), "dropped_unreachable": dropped, "dropped_duplicates": duplicates}, indent=2)
    else:
        if args.drop_unreachable:
            print(f"dropped {dropped} unreachable records")
        if duplicates:
            print(f"dropped {duplicates} duplicate records")
        print(format_cv_table(report))
    return 0


@reports_errors("classifier ceiling")
def ceiling_command(args: argparse.Namespace) -> int:
    if not args.sampler.startswith("presto-"):
        raise ValueError(f"--sampler {args.sampler!r}: the ceiling needs the prefetched subtrees of round-based PreSTO "
                         "(a sampler named presto-...)")
    with naming_undecodable(args.records, "--records"):
        records = read_node_records(args.records, warn=_warn)
    records = _of_sampler(records, args.sampler)
    _warn_bounds(records)
    model = classifier_from_args(args)
    warn_shipped("classifier ceiling", args, records[0].model, [args.sampler.removeprefix("presto-")])
    result = ceiling(recorded_rounds(records), args.npf, model.branch_prob_of, tree_position=model.uses_tree_position)
    result["classifier"] = args.classifier or "shipped"
    if args.json:
        print_json(result, indent=2)
    else:
        print(format_ceiling(result))
    return 0
