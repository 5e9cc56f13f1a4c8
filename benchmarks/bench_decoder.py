"""Benchmark the LSTM decoder against the reference implementation, side by side in one run.

    python benchmarks/bench_decoder.py [--device cpu] [--repeats 5] [--reference DIR_OR_GIT_DIR]

Features stand in for a ResNet-101 grid (14x14x2048); the vocabulary has 10,000 words, as on
COCO; both decoders are 512 wide (attention, embedding, LSTM). Measured:

- a training step, batch 32, captions of `--length` words: ours (forward, cross-entropy, the
  attention penalty, backward, AdamW) against the reference's train.py step (its forward with
  its sort by length, pack_padded loss, doubly stochastic term, gradient clamp, Adam);
- beam search, K=3: ours over `--beam-images` images at once and over one image, against the
  reference's caption.py beam search, one image at a time. <eos> is made unreachable in both,
  so both run the same number of steps (`--beam-length`, default 51: the reference's `step > 50`).

The reference (sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning) is read from --reference, else
$CAPTIONER_REFERENCE, else the local mirror; without it only our rows are printed. Our dense
layers multiply through oneDNN on the CPU (`captioner.models.products`); `--products torch`
gives them torch's own products, as the reference has, to show what that route adds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_sat import (  # noqa: E402
    ReferenceUnavailable,
    beam_search_one,
    load_reference,
    make_decoder,
    train_step,
)

from captioner.core.runtime import set_threads  # noqa: E402
from captioner.models import products  # noqa: E402
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search  # noqa: E402
from captioner.models.lstm_decoder import LSTMDecoder  # noqa: E402

BOS, EOS = 1, 2


def timed(
    fn: Callable[[], object], repeats: int, device: torch.device, warm: bool = True, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Median seconds of `repeats` calls after one warm-up call, by `clock`."""
    if warm:
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = clock()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(clock() - start)
    return statistics.median(times)


def timed_pair(
    ours: Callable[[], object],
    theirs: Callable[[], object] | None,
    repeats: int,
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float | None]:
    """Median seconds of each, their calls alternating, so a change in the machine's background
    load hits both alike (this is how the ratios stay meaningful on a shared machine)."""
    if theirs is None:
        return timed(ours, repeats, device, clock=clock), None
    ours()
    theirs()
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours, 1, device, warm=False, clock=clock))
        b.append(timed(theirs, 1, device, warm=False, clock=clock))
    return statistics.median(a), statistics.median(b)


def row(what: str, seconds: float, rate: float, unit: str) -> None:
    print(f"| {what} | {seconds * 1000:,.0f} ms | {rate:.2f} {unit} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--length", type=int, default=20, help="training caption length (words fed)")
    parser.add_argument("--beam-length", type=int, default=51, help="beam search steps (the reference's: 51)")
    parser.add_argument("--beam-images", type=int, default=32, help="images per batch in our beam search")
    parser.add_argument("--reference-images", type=int, default=4, help="images the reference captions, one by one")
    parser.add_argument("--reference", help="reference checkout or git dir (default: $CAPTIONER_REFERENCE or the mirror)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: captioner.core.runtime's)")
    parser.add_argument(
        "--products", choices=["onednn", "torch"], default="onednn",
        help="our dense layers' fp32 products: through oneDNN (captioner.models.products, the default) or torch's own (MKL)",
    )
    parser.add_argument(
        "--cpu-time", action="store_true",
        help="time by this process's CPU time, not the wall clock: on a machine busy with other jobs, at --threads 1, "
        "it counts our own work and not the time others held the core (threads waiting on each other count at 2+)",
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    threads = set_threads(args.threads)
    products.set_onednn(args.products == "onednn")
    device = torch.device(args.device)
    torch.manual_seed(0)
    N, D, V, T, B = 196, 2048, args.vocab, args.length, 32
    print(
        f"device {device}, threads {threads}, LSTM 512/512/512, grid 14x14x{D}, vocabulary {V}, "
        f"{'CPU' if args.cpu_time else 'wall'} time, our products: {args.products}"
    )
    try:
        ref = load_reference(args.reference, device)
    except ReferenceUnavailable as e:
        ref = None
        print(f"reference not available, ours only: {e}")

    feats = torch.randn(B, N, D, device=device)
    tokens = torch.randint(4, V, (B, T + 1), device=device)
    decoder = LSTMDecoder(V, D, embed_dim=512, hidden_dim=512, attention_dim=512, dropout=0.5).to(device)
    optimizer = torch.optim.AdamW(decoder.parameters(), lr=1e-4, fused=True)  # as training.schedule.make_optimizer
    real = torch.ones(B, T, dtype=torch.bool, device=device)

    def our_train_step() -> None:
        decoder.train()
        out = decoder(feats, tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss = loss + decoder.attention_penalty(out.attn, real)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"\ntraining step, batch {B}, {T} words per caption")
    print("| what | time | throughput |\n|---|---:|---:|")
    reference_step = None
    if ref is not None:
        ref_decoder = make_decoder(ref, V, D, device)
        ref_optimizer = torch.optim.Adam(ref_decoder.parameters(), lr=4e-4)
        grid = feats.view(B, 14, 14, D)  # its forward takes (B, g, g, D)
        caplens = torch.full((B, 1), T + 1, device=device)  # <start> + T words: it decodes T steps

        def reference_step() -> None:
            train_step(ref_decoder, ref_optimizer, grid, tokens, caplens)

    ours, theirs = timed_pair(our_train_step, reference_step, args.repeats, device, clock)
    row("ours", ours, B / ours, "captions/s")
    if theirs is not None:
        row("reference (train.py step)", theirs, B / theirs, "captions/s")
        print(f"ours is {theirs / ours:.2f}x faster")

    L, K = args.beam_length, 3
    print(f"\nbeam search K={K}, {L} steps (<eos> unreachable)")
    print("| what | time | throughput |\n|---|---:|---:|")
    decoder.eval()
    with torch.no_grad():
        decoder.out_vocab.bias[EOS] = -1e4
    reference_beam = None
    steps: list[int] = []
    if ref is not None:
        with torch.no_grad():
            ref_decoder.fc.bias[EOS] = -1e4
        ref_images = torch.randn(args.reference_images, 14, 14, D, device=device)

        def reference_beam() -> None:
            for image in ref_images:
                steps.append(beam_search_one(ref_decoder, image[None], BOS, EOS, beam_size=K, max_steps=L - 1)[1])

    rates, ref_seconds = {}, []
    for batch in sorted({1, args.beam_images}):
        images = torch.randn(batch, N, D, device=device)
        seconds, theirs = timed_pair(
            lambda: beam_search(decoder, images, SpecialTokens(BOS, EOS), DecodeOptions(beam_size=K, max_length=L)),
            reference_beam if batch == args.beam_images else None,
            args.repeats,
            device,
            clock,
        )
        rates[batch] = batch / seconds
        row(f"ours, {batch} image(s) at once", seconds, rates[batch], "images/s")
        if theirs is not None:
            ref_seconds.append(theirs)
    if ref_seconds:
        assert set(steps) == {L}, f"the reference ran {set(steps)} steps, expected {L}"
        ref_rate = args.reference_images / statistics.median(ref_seconds)
        row(f"reference (caption.py), {args.reference_images} image(s) one at a time", statistics.median(ref_seconds), ref_rate, "images/s")
        for batch, rate in rates.items():
            print(f"ours at {batch} image(s) at once is {rate / ref_rate:.1f}x the reference's images/s")


if __name__ == "__main__":
    main()
