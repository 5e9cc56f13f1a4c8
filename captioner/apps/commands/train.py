"""`captioner train CONFIG [overrides]`: cross-entropy or self-critical training from a YAML config."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a captioner from a YAML config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=5")
    train.add_argument("--resume", action="store_true", help="continue from train.out_dir/last.pt")
    train.add_argument(
        "--init", metavar="CHECKPOINT", help="start from this checkpoint's model and vocabulary (e.g. SCST after cross-entropy); sets train.init"
    )
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.core.config import load_config
    from captioner.apps.runs import train_run

    overrides = [*args.overrides, *([f"train.init={args.init}"] if args.init else [])]
    config = load_config(args.config, overrides)
    if config.train.threads:
        from captioner.core.runtime import set_threads

        set_threads(config.train.threads)  # the run's own setting beats the process default set in main
    best = train_run(config, resume=args.resume)
    print(f"best checkpoint: {best}")
    return 0
