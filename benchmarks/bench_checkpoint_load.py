"""Loading a fine-tuned COCO checkpoint to caption with it: the whole payload read, as training's resume reads
it, against the read for inference, which leaves the optimizer's state on disk and maps the weights from the
file; side by side in fresh processes, the two alternating round by round.

    python -m benchmarks checkpoint_load [--config configs/coco_lstm_resnet101.yaml] [--rounds 3]

The checkpoint is the config's model with random weights, 10,000 words, and AdamW's moments for every
parameter the config trains (ResNet-101's top blocks and the decoder), as a cross-entropy run's best.pt holds
them. A process reads it once (its checksum, its payload, the model built and loaded) and reports its wall and
CPU seconds and its peak resident memory above what it held before the read.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from captioner.apps.arguments import positive_int

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, child_json, in_turn, print_environment, run_main, summarise  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
READS = {"whole": "the whole payload", "inference": "for inference"}


def write_checkpoint(config_file: Path, path: Path) -> dict:
    """The config's model and its optimizer's state after one step, saved as training saves best.pt."""
    import torch

    from benchmarks.workloads import VOCAB, build, words
    from captioner.core.config import load_config
    from captioner.models.checkpoint import save_checkpoint
    from captioner.training.run_setup import make_optimizer

    config = load_config(config_file)
    model = build(config, words(VOCAB))
    optimizer = make_optimizer(model, config, 1.0)
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # AdamW's two moments for every trained parameter
    save_checkpoint(path, model, config, optimizer=optimizer.state_dict(), train_state={"epoch": 1, "history": []})
    state = optimizer.state_dict()["state"].values()
    return {"file_mb": path.stat().st_size / 1e6,
            "weights_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 1e6,
            "moments_mb": sum(t.numel() * t.element_size() for s in state for t in s.values()) / 1e6}


def child(path: Path, read: str) -> dict:
    """In this process: the model of `path`, read the `read` way -> seconds, CPU seconds, peak MB."""
    import torch  # noqa: F401 - imported before the baseline: its libraries are not the read's memory

    from captioner.models.captioner import Captioner
    from captioner.models.checkpoint_format import read_checkpoint

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu = time.perf_counter(), time.process_time()
    model = Captioner.from_checkpoint_payload(read_checkpoint(path, for_inference=read == "inference"), path).eval()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {"seconds": seconds, "cpu": cpu, "peak_mb": peak, "parameters": sum(p.numel() for p in model.parameters())}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("checkpoint_load", __doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs/coco_lstm_resnet101.yaml",
                        help="the run config whose model and optimizer the checkpoint holds")
    parser.add_argument("--rounds", type=positive_int, default=3, help="processes of each read, alternating")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one process's measurement
    parser.add_argument("--read", choices=READS, help=argparse.SUPPRESS)
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)  # the checkpoint, written in a child
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.read)))
        return 0
    if args.write:
        print(json.dumps(write_checkpoint(args.config, args.write)))
        return 0
    from captioner.core.config import load_config

    load_config(args.config)  # a config that does not load: one line here, not the child's traceback
    print_environment(args)
    with tempfile.TemporaryDirectory(prefix="checkpoint_load-") as folder:
        path = Path(folder) / "best.pt"
        # in a child too: a process's peak memory counts its parent's from before its exec, so this one stays small
        # the config's absolute path: the child runs in the repository (timing.child_json), not in this folder
        sizes = child_json("checkpoint_load", ["--write", str(path), "--config", str(args.config.resolve())])
        print(f"\n{args.config.name}: best.pt of {sizes['file_mb']:,.0f} MB (weights {sizes['weights_mb']:,.0f} MB, "
              f"AdamW's moments {sizes['moments_mb']:,.0f} MB); {args.rounds} fresh process(es) per read, alternating")
        results: dict[str, list[dict]] = {read: [] for read in READS}
        for read in in_turn(list(READS), args.rounds):
            results[read].append(child_json("checkpoint_load", ["--child", str(path), "--read", read]))
    print("\n| read | seconds | CPU seconds | peak MB above the process's before the read |\n"
          "|---|---:|---:|---:|")
    seconds = {read: summarise([r["seconds"] for r in rows]) for read, rows in results.items()}
    for read, rows in results.items():
        print(f"| {READS[read]} | {seconds[read]} | {statistics.median(r['cpu'] for r in rows):.2f} | "
              f"{max(r['peak_mb'] for r in rows):,.0f} |")
    print(f"\nfor inference: {seconds['whole'].median / seconds['inference'].median:.2f}x the speed of the whole read")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
