"""What fine-tuning the encoder's top blocks costs on this machine: the Flickr8k config's training
step with 0, 2 and 6 of EfficientNet-Lite0's top blocks trained, from the feature store (what the
frozen blocks make, stored once) and from the images (the whole backbone run every step).

    python benchmarks/bench_fine_tune.py [--config configs/flickr8k_transformer_lite0.yaml] [--tops 0,2,6] [--steps 4] [--rounds 2]

The batches are real: Flickr8k training photos from ../shared/data (224 px, the training
transform), 32 a batch with all five captions, the vocabulary of the whole training split.
Each row trains its own copy of the model (the same initial weights, AdamW) on the same batches;
the store rows are the frozen part's output on those batches, in fp16 as the store keeps them.
Printed per row: seconds per step (median over rounds), images per second, the store's bytes per
image and an epoch of the 6,000 training photos at that speed. Wall seconds: name the processor
(`lscpu`) and what else ran beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch
from shared_data import SHARED_DATA
from torch.utils.data import DataLoader

from captioner.core.config import load_config
from captioner.core.runtime import set_threads
from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions
from captioner.data.flickr8k import load_flickr8k
from captioner.data.images import ImageTransform
from captioner.models.build import build_model
from captioner.text.vocab import Vocabulary
from captioner.training.loop import caption_loss

TRAIN_IMAGES = 6000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/flickr8k_transformer_lite0.yaml")
    parser.add_argument("--tops", default="0,2,6", help="comma-separated counts of top blocks to train")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per row and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: captioner.core.runtime's)")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    tops = [int(t) for t in args.tops.split(",")]

    records = load_flickr8k(SHARED_DATA / "flickr8k", "train", SHARED_DATA / "flickr8k_224" / "images")
    base = load_config(args.config, ["train.device=cpu"])
    data = base.data
    vocab = Vocabulary.build((c for r in records for c in r.captions), data.min_word_count)
    dataset = CaptionDataset(records[: data.batch_size * (args.steps + 1)], vocab, ImageTransform(data.image_size, train=True),
                             data.max_caption_length, "all")
    batches: list[CaptionBatch] = list(DataLoader(dataset, batch_size=data.batch_size, collate_fn=collate_captions))
    print(f"threads {threads}; {base.model.encoder.name} at {data.image_size} px + {base.model.decoder.type}, "
          f"batch {data.batch_size} photos x 5 captions, vocabulary {len(vocab)}; {args.steps} steps x {args.rounds} rounds")

    rows = []
    for top in tops:
        config = load_config(args.config, ["train.device=cpu", f"model.encoder.fine_tune_blocks={top}"])
        torch.manual_seed(0)
        model = build_model(config, vocab).train()
        with torch.no_grad():  # the store's rows of these batches: the frozen part's output, in fp16
            stored = [replace(b, images=model.encoder.stored_part(b.images)[0].to(torch.float16)) for b in batches]  # (B, n, C)
        row_bytes = stored[0].images[0].numel() * 2
        variants = [("store", stored, True)] + ([("images", batches, False)] if top else [])
        for source, feed, encoded in variants:
            trained = build_model(config, vocab).train()
            trained.load_state_dict(model.state_dict())
            optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4)
            seconds = []
            for _ in range(args.rounds):
                for i, batch in enumerate(feed):
                    if i == 1:
                        start = time.perf_counter()
                    loss, _ = caption_loss(trained, batch, config, encoded=encoded)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                seconds.append((time.perf_counter() - start) / (len(feed) - 1))
            step = statistics.median(seconds)
            rows.append((top, source, step, data.batch_size / step, row_bytes if encoded else 0))

    print("\n| top blocks trained | from | s/step | images/s | store bytes/image | an epoch of 6,000 photos |")
    print("|---:|---|---:|---:|---:|---:|")
    for top, source, step, rate, nbytes in rows:
        store = f"{nbytes / 1024:.1f} KB" if nbytes else "-"
        print(f"| {top} | {source} | {step:.3f} | {rate:.1f} | {store} | {TRAIN_IMAGES / rate / 60:.1f} min |")


if __name__ == "__main__":
    main()
