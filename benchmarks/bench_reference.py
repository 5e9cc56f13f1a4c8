"""Our LSTM decoder beside the Show-Attend-Tell tutorial's (sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning),
side by side in one process, their calls alternating, both with the same torch threads.

    python -m benchmarks reference [--reference DIR_OR_GIT_DIR] [--repeats 5] [--threads N] [--record ID]

The same task on both sides, at the tutorial's sizes (a 14x14x2048 grid, 10,000 words, attention, embedding and LSTM
512 wide):
- a training step of 32 captions of 20 words: ours as `training.loop` runs it (caption_loss,
  backward, gradient clipping, fused AdamW; `workloads.lstm_train`) against its train.py step (its
  forward sorting by length, pack_padded loss, doubly stochastic term, gradient clamp, Adam);
- beam search, beam 3, 51 steps with <eos> unreachable on both sides: ours over 32 images at once
  (`Captioner.decode`) against its caption.py search, one image at a time (`--reference-images`).
After the times, each side's work (FLOPs counted op by op) and the rate it reaches: ours is faster by the
tutorial's work over ours times our rate over its, and the GEMM rate of each route says which rate a processor
gives each side. The tutorial's code is read from --reference, else $CAPTIONER_REFERENCE, else the local mirror
(`benchmarks/reference_sat.py`); nothing of it is copied here. Without it, ours alone is printed. `--record ID`
writes the run as record ID of docs/results/bench_reference.json, with its command, commit, processor and date."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from captioner.apps.arguments import positive_int
from captioner.core.process_settings import set_threads
from captioner.core.config_sections import thread_count
from captioner.models import products

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import workloads  # noqa: E402
from benchmarks.bench_roofline import gemm_rates  # noqa: E402
from benchmarks.op_counter import flops_of  # noqa: E402
from benchmarks.records import RESULTS, add_record_options, check_record_option, command_line, record_run  # noqa: E402
from benchmarks.reference_sat import (  # noqa: E402
    ReferenceUnavailable,
    beam_search_one,
    load_reference,
    make_decoder,
    train_step,
)
from benchmarks.timing import (  # noqa: E402
    alternate,
    argument_parser,
    json_option,
    measure,
    print_environment,
    print_json,
    run_main,
)

BOS, EOS = 1, 2  # the special ids of `workloads.words`, given to the reference's search alike
CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"  # oneDNN's kernels kept; read as the process starts
PATHS = {"--reference": "TUTORIAL"}  # the options whose value is a path: written so in a record


def through_onednn(module: torch.nn.Module) -> int:
    """Each plain nn.Linear of `module` made to run through oneDNN's inner product, as ours do -> how many."""
    layers = [layer for layer in module.modules() if type(layer) is torch.nn.Linear]
    for layer in layers:
        products.onednn_linear(layer)
    return len(layers)


def reference_actions(location: str | None, reference_images: int, their_products: str = "torch") -> dict[str, object]:
    """The tutorial's train step and beam search at the workloads' sizes -> {"train", "beam"}; with
    `their_products` "onednn", its linear layers through oneDNN's inner product (its LSTM cell as it is)."""
    ref = load_reference(location, torch.device("cpu"))
    torch.manual_seed(0)
    decoder = make_decoder(ref, workloads.VOCAB, workloads.FEAT_DIM, torch.device("cpu"))
    if their_products == "onednn":
        through_onednn(decoder)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=4e-4)  # its train.py's decoder optimizer
    generator = torch.Generator().manual_seed(0)
    side = workloads.GRID[0]
    grid = torch.randn(workloads.BATCH, side, side, workloads.FEAT_DIM, generator=generator)  # (B, g, g, D)
    caps = torch.randint(4, workloads.VOCAB, (workloads.BATCH, workloads.WORDS + 1), generator=generator)
    caplens = torch.full((workloads.BATCH, 1), workloads.WORDS + 1)  # <start> + 20 words: 20 steps decoded
    with torch.no_grad():
        decoder.fc.bias[EOS] = -1e4  # <eos> unreachable: every search runs all its steps
    images = torch.randn(reference_images, side, side, workloads.FEAT_DIM, generator=generator)  # (n, g, g, D)
    steps: list[int] = []

    def beam() -> None:
        for image in images:
            with products.reused_weights():  # through oneDNN: its weights blocked once a search, as ours are
                steps.append(beam_search_one(decoder, image[None], BOS, EOS, beam_size=workloads.BEAM,
                                             max_steps=workloads.BEAM_STEPS - 1)[1])
        if set(steps) != {workloads.BEAM_STEPS}:
            raise RuntimeError(f"the reference ran {sorted(set(steps))} steps, not {workloads.BEAM_STEPS}")

    return {"train": lambda: train_step(decoder, optimizer, grid, caps, caplens), "beam": beam}


def work_lines(rows: Sequence[tuple[str, float, float, float, float]]) -> list[str]:
    """(work, our FLOPs, our seconds, the tutorial's FLOPs, its seconds) -> a table of each side's counted
    work and rate: ours is faster by the tutorial's work over ours times our rate over its."""
    lines = ["| work | ours | tutorial | its work / ours | our rate / its | ours is |",
             "|---|---:|---:|---:|---:|---:|"]
    for about, flops, seconds, their_flops, their_seconds in rows:
        rate, their_rate = flops / seconds, their_flops / their_seconds
        lines.append(f"| {about} | {flops / 1e9:.2f} GFLOP at {rate / 1e9:.0f} GFLOP/s | {their_flops / 1e9:.2f} GFLOP "
                     f"at {their_rate / 1e9:.0f} GFLOP/s | {their_flops / flops:.2f}x | {rate / their_rate:.2f}x | "
                     f"{their_seconds / seconds:.2f}x faster |")
    return lines


def record_numbers(numbers: dict) -> dict[str, str]:
    """A run's numbers (as --json prints them, the tutorial's beside ours) under bench_reference.json's columns."""
    cells = {"train": f"{numbers['train_ms']:,.0f} / {numbers['reference_train_ms']:,.0f} ms",
             "train_ratio": f"{numbers['train_ratio']:.2f}x",
             "beam": f"{numbers['beam_images_per_s']:.1f} / {numbers['reference_beam_images_per_s']:.2f}",
             "beam_ratio": f"{numbers['beam_ratio']:.1f}x"}
    work = numbers.get("work", {})
    words = {"train step": "train {} GFLOP", "beam search, one image": "beam {} GFLOP an image"}
    parts = [words[about].format(f"{w['gflop']:.2f} / {w['reference_gflop']:.2f}")
             + f" at {w['gflop'] / w['seconds']:.0f} / {w['reference_gflop'] / w['reference_seconds']:.0f}"
             for about, w in work.items()]
    return cells | ({"work": "; ".join(parts)} if parts else {})


def arguments() -> argparse.ArgumentParser:
    """The parser of `python -m benchmarks reference`."""
    parser = argument_parser("reference", __doc__, malloc="glibc")  # both sides as a plain process has it
    parser.add_argument("--reference", default=None,
                        help="the tutorial's checkout or git directory (default: $CAPTIONER_REFERENCE or the mirror)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed calls of each, alternating, after a warm-up")
    parser.add_argument("--reference-images", type=positive_int, default=2,
                        help="images the reference captions one by one per timed call")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads for both (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--their-products", choices=("torch", "onednn"), default="torch",
                        help="the tutorial's linear layers through torch's own products, as its code is (MKL, "
                             "whose kernels are AVX2 on an AMD processor), or through oneDNN's inner product as ours: "
                             "a stand-in for a BLAS with AVX-512 kernels, as MKL has on an Intel processor")
    add_record_options(parser, "bench_reference", "the times and ratios")
    json_option(parser)
    return parser


def main(argv: list[str] | None = None, results: Path = RESULTS) -> int:
    parser = arguments()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    check_record_option(parser, args, "bench_reference", results)
    threads = set_threads(args.threads)
    print_environment(args)
    if args.their_products == "onednn" and not os.environ.get(CACHE_VARIABLE):
        print(f"{CACHE_VARIABLE} is unset: with the tutorial's products beside ours in oneDNN's default cache "
              f"(1,024), our beam search ran about 15% slower when measured; run with {CACHE_VARIABLE}=8192")
    try:
        theirs = reference_actions(args.reference, args.reference_images, args.their_products)
    except ReferenceUnavailable as e:
        if args.record:
            raise SystemExit(f"--record {args.record}: the tutorial's code is not available, and a record of this "
                             f"measure sets it beside ours ({e})") from None
        theirs = {}
        print(f"reference not available, ours alone: {e}")
    train = workloads.lstm_train()
    print(f"{threads} threads both sides; fp32; our dense layers through "
          f"{'oneDNN' if products.route_taken() else 'F.linear'}, theirs through "
          + ("torch's own products" if args.their_products == "torch"
             else "oneDNN's inner product (--their-products onednn; its LSTM cell through torch's)"))
    print("\n| work | ours | tutorial | ours is |\n|---|---:|---:|---:|")
    actions = {"ours": train.run, **({"theirs": theirs["train"]} if theirs else {})}
    timed = alternate(actions, args.repeats)
    ours = timed["ours"].median
    numbers: dict[str, object] = {"threads": threads, "train_ms": ours * 1e3, "reference_train_ms": None,
                                  "train_ratio": None}
    line = f"| {train.about} | {ours * 1e3:,.0f} ms | "
    work: list[tuple[str, float, float, float, float]] = []  # (work, our FLOPs, our s, its FLOPs, its s)
    if theirs:
        numbers |= {"reference_train_ms": timed["theirs"].median * 1e3, "train_ratio": timed["theirs"].median / ours}
        line += f"{timed['theirs'].median * 1e3:,.0f} ms | {timed['theirs'].median / ours:.2f}x faster |"
        work.append(("train step", flops_of(train.run), ours, flops_of(theirs["train"]), timed["theirs"].median))
    print(line + ("" if theirs else " | |"), flush=True)
    del train
    beam = workloads.lstm_beam()
    images = workloads.BATCH
    if theirs:
        timed = alternate({"ours": beam.run, "theirs": theirs["beam"]}, args.repeats)
        ours_rate = images / timed["ours"].median
        their_rate = args.reference_images / timed["theirs"].median
        print(f"| {beam.about} (tutorial: one image at a time) | {ours_rate:.1f} images/s | "
              f"{their_rate:.2f} images/s | {ours_rate / their_rate:.1f}x the images/s |")
        numbers |= {"beam_images_per_s": ours_rate, "reference_beam_images_per_s": their_rate,
                    "beam_ratio": ours_rate / their_rate}
        work.append(("beam search, one image", flops_of(beam.run) / images, 1 / ours_rate,
                     flops_of(theirs["beam"]) / args.reference_images, 1 / their_rate))
    else:
        ours_rate = images / measure(beam.run, args.repeats).median
        print(f"| {beam.about} | {ours_rate:.1f} images/s | | |")
        numbers |= {"beam_images_per_s": ours_rate, "reference_beam_images_per_s": None, "beam_ratio": None}
    if work:
        rates = gemm_rates(2048)
        print("\nThe work counted op by op (FLOPs of products, as `python -m benchmarks roofline` counts them), "
              "and the rate each side reaches:\n" + "\n".join(work_lines(work)))
        print("fp32 GEMM of 2048 squares here: " + ", ".join(f"{name} {rate / 1e9:.0f} GFLOP/s"
                                                             for name, rate in rates.items())
              + " (torch's own products, the tutorial's, are torch.mm's)")
        numbers |= {"work": {about: {"gflop": flops / 1e9, "seconds": seconds, "reference_gflop": their_flops / 1e9,
                                     "reference_seconds": their_seconds}
                             for about, flops, seconds, their_flops, their_seconds in work},
                    "gemm_gflop_per_s": {name: rate / 1e9 for name, rate in rates.items()}}
    if args.record:
        command = command_line("reference", argv, PATHS, settings=(CACHE_VARIABLE,))
        record_run("bench_reference", args, record_numbers(numbers), command, results)
    print_json(args, numbers)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
