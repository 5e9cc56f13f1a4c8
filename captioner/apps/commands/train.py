"""`captioner train CONFIG [overrides]`: cross-entropy or self-critical training from a YAML config.
SIGTERM or SIGINT stops it after the step with last.pt saved, the resume command, and exit status 128 + signal."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from captioner.apps.arguments import add_device_argument, device_overrides
from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError


def add_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser(
        "train", needs="a config, e.g. captioner train configs/shapes_lstm.yaml",
        help="train a captioner from a YAML config")
    train.add_argument("config",
                       help="a YAML config: one under configs/ or your own (captioner config keys lists the keys)")
    train.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=5")
    train.add_argument("--resume", action="store_true", help="continue from train.out_dir/last.pt")
    train.add_argument("--init", metavar="CHECKPOINT", help="start from this checkpoint's model and vocabulary "
                                                            "(e.g. SCST after cross-entropy); sets train.init")
    add_device_argument(train, default=None)
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.apps.prerequisites import require_data, require_start, writable_folder
    from captioner.core.config import load_config
    from captioner.training import distributed
    from captioner.training.run_folders import check_run_folders, require_no_run

    if args.init is not None and not args.init.strip():  # "" would start from scratch without a word
        raise CaptionerError("train --init: an empty path; name the checkpoint to start from, or leave out --init")
    options = [*([f"train.init={args.init}"] if args.init else []), *device_overrides(args)]  # --init, --device
    config = load_config(args.config, [*args.overrides, *options])  # the run fixes its threads (training/speed.py)
    require_start(config, args.resume)
    if not args.resume and distributed.is_main_process():  # rank 0 writes the run folder, so its view of it decides
        require_no_run(config.train.out_dir)
    require_data(config.data, ["train", "val"])
    check_run_folders(config)  # a file where the run makes a folder: before train.out_dir is made
    if distributed.is_main_process():  # rank 0 alone writes the run folder; the others never touch it
        writable_folder(config.train.out_dir, "train.out_dir")
    from captioner.training.loop import Interrupted  # the training stack, once the checks above pass
    try:
        best = train_run(config, resume=args.resume)
    except Interrupted as stopped:
        if distributed.is_main_process():  # one line for the whole run, from rank 0
            print(f"stopped by {stopped}; resume with: {resume_command(args)}", file=sys.stderr)
        return 128 + stopped.signal  # as a shell reports a process its signal ended
    if distributed.is_main_process():
        print(f"next: {shlex.join(['captioner', 'evaluate', str(best), '--split', 'test'])}")
    return 0


def train_run(config: Config, resume: bool = False) -> Path:
    """Train as `config` says; returns the best checkpoint, with training_curves.png beside it."""
    from captioner.training.distributed import is_main_process
    from captioner.training.fit import fit  # the training stack, only when there is a model to train
    from captioner.viz.curves import plot_run

    best = fit(config, resume=resume)
    if is_main_process():  # under torchrun, rank 0 alone writes the run's files
        plot_run(config.train.out_dir, config.train.val_metric, config.train.val_beam_size)
    return best


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run from its last.pt (under torchrun, as many processes per node)."""
    from captioner.training import distributed

    options = [*(["--init", args.init] if args.init else []), *(["--device", args.device] if args.device else [])]
    words = ["train", args.config, *args.overrides, *options, "--resume"]
    if not distributed.launched():
        return shlex.join(["captioner", *words])
    per_node = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if os.environ.get("WORLD_SIZE") == per_node:  # one node
        return shlex.join(["torchrun", f"--nproc_per_node={per_node}", "-m", "captioner", *words])
    return f"torchrun (this job's options) -m captioner {shlex.join(words)}"
