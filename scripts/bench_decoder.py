"""Benchmark the LSTM decoder: a training step and batched beam search, on features alone.

    python scripts/bench_decoder.py [--device cpu] [--repeats 5]

Features stand in for a ResNet-101 grid (14x14x2048); the vocabulary has 10,000 words and
captions 20 tokens, as on COCO. Prints a table of median times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from captioner.decoding import beam_search
from captioner.models.lstm_decoder import LSTMDecoder


def timed(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--length", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    N, D, V, T = 196, 2048, args.vocab, args.length
    decoder = LSTMDecoder(V, D, embed_dim=512, hidden_dim=512, attention_dim=512, dropout=0.5).to(device)
    optimizer = torch.optim.AdamW(decoder.parameters(), lr=1e-4)
    print(f"device {device}, threads {torch.get_num_threads()}, LSTM 512/512/512, grid 14x14x{D}, vocabulary {V}, length {T}")

    feats = torch.randn(32, N, D, device=device)
    tokens = torch.randint(4, V, (32, T + 1), device=device)

    def train_step() -> None:
        decoder.train()
        out = decoder(feats, tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss = loss + decoder.attention_penalty(out.attn, torch.ones(32, T, dtype=torch.bool, device=device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step = timed(train_step, args.repeats, device)
    print(f"| training step, batch 32 | {step * 1000:.0f} ms | {32 / step:.1f} captions/s |")

    decoder.eval()
    for batch in (1, 32):
        images = torch.randn(batch, N, D, device=device)
        # max_length fixed and <eos> never chosen, so every run decodes the same number of steps.
        with torch.no_grad():
            decoder.out_vocab.bias[2] = -1e4
        seconds = timed(lambda: beam_search(decoder, images, 1, 2, beam_size=3, max_length=T), args.repeats, device)
        print(f"| beam search K=3, batch {batch}, {T} steps | {seconds * 1000:.0f} ms | {batch / seconds:.1f} images/s |")


if __name__ == "__main__":
    main()
