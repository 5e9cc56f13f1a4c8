"""Time one decoding step of the transformer decoder: key/value cache versus recomputing the prefix.

At caption length L, the cached path is one `step` with L-1 positions already in the cache; the
uncached path is what a decoder without a cache does at that step: `forward` over all L tokens
(which also projects the grid and the cross-attention keys and values again) and keeping the last
position. Sizes are a COCO beam search: 32 images x 3 beams, d_model 512, 3 layers, 8 heads, a
14x14 grid of 2048-d features, 10,000 words; random weights, eval mode, no gradients.

    python benchmarks/bench_transformer_step.py [--lengths 10 20 40] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from captioner.models.transformer_decoder import TransformerDecoder


def best_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` calls, in milliseconds (the least disturbed by other processes)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per cell, best kept (x10 for the cached step)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    rows, grid, feat_dim, vocab = args.images * args.beam, 14 * 14, 2048, 10_000
    decoder = TransformerDecoder(vocab, feat_dim, d_model=512, num_layers=3, num_heads=8, ff_dim=2048).to(device).eval()
    feats = torch.randn(rows, grid, feat_dim, device=device)  # (B*K, N, D)
    tokens = torch.randint(4, vocab, (rows, max(args.lengths)), device=device)  # (B*K, T)
    memory = decoder.prepare(feats)  # once per image, as beam search does
    print(f"{rows} rows ({args.images} images x {args.beam} beams), {torch.get_num_threads()} threads, {device}")
    print(f"{'length':>6} {'cached ms/step':>15} {'recompute ms/step':>18} {'speedup':>8}")
    for length in args.lengths:
        state = decoder.init_state(memory, capacity=length)  # the cache a decode of this length holds
        for t in range(length - 1):  # fill the cache with the first L-1 positions
            _, _, state = decoder.step(memory, tokens[:, t], state)
        last = tokens[:, length - 1]  # (B*K,)
        cached = best_ms(lambda: decoder.step(memory, last, state), 10 * args.repeats)
        recompute = best_ms(lambda: decoder(feats, tokens[:, :length]).logits[:, -1].log_softmax(-1), args.repeats)
        print(f"{length:>6} {cached:>15.1f} {recompute:>18.1f} {recompute / cached:>7.1f}x")


if __name__ == "__main__":
    main()
