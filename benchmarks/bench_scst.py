"""Time the SCST reward and the SCST training step.

    python benchmarks/bench_scst.py reward [path/to/captions_val2014.json] [--images 5000]
    python benchmarks/bench_scst.py step runs/flickr8k_lstm_lite0_scst/best.pt [--steps 8] [--baseline greedy|mean] [--root ROOT]
    python benchmarks/bench_scst.py step configs/flickr8k_lstm_lite0_scst.yaml --data data.root=../shared/data/flickr8k \
        data.image_root=../shared/data/flickr8k_224/images   # an untrained model of the config, its data where it is here
    python benchmarks/bench_scst.py syncs [--root ROOT]   # ROOT: a checkout's folder (default this one)
    # today's code against an older commit: git archive COMMIT captioner | tar -x -C /tmp/old; ... syncs --root /tmp/old

`reward`: the CIDEr-D reward over the references of COCO val2014 (document frequencies from all
their ~200k captions, built once), scoring one held-out reference of each image as the candidate
against the image's other references, batch by batch as SCST does (160 = 32 images x 5 samples);
beside it, pycocoevalcap's CiderScorer on the same batches (which rebuilds its document frequencies
from each batch, so it is not the same number, only the same work the naive loop would do).

`reward` also times the vectorised reward (`rewards.DeviceReward`, the reference table of
captioner/training/reward_table.py, float64 on the CPU) on the same batches, beside the Python one.

`syncs`: host-device synchronisations per SCST step, counted on the CPU with the simulated device
of tests/test_sync.py (every value read or value-sized op on a tensor that would live on the GPU),
for both decoders and both baselines: 8 images x 5 samples, max_length 16, a tiny model.

`step`: SCST steps of a trained checkpoint (its config's `scst` section and batch size: an SCST
checkpoint brings its stage's recipe) on its training images' references, with random image
features of the checkpoint's grid (the step's cost does not depend on what the features show, only
on how long the sampled captions are, which a trained decoder keeps realistic); reports the time of
a step, the share spent in the reward, and the objective's logged values.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from shared_data import SHARED_DATA


def clock() -> float:
    """CPU seconds of this process: the machine is shared, and CPU time is what a run would spend
    on an idle core (wall time is printed beside it where it matters)."""
    return time.process_time()


def bench_reward(args: argparse.Namespace) -> None:
    from pycocoevalcap.cider.cider_scorer import CiderScorer

    from captioner.evaluation.results_files import load_references
    from captioner.text.vocab import Vocabulary, tokenize
    from captioner.training.rewards import Bleu4, CiderD, reference_corpus

    references = load_references(args.annotations)
    texts = [captions for captions in references.values() if len(captions) >= 2][: args.corpus or None]
    vocab = Vocabulary.build((c for captions in texts for c in captions), 5)
    start = clock()
    ids = reference_corpus(vocab, texts)
    tokenize_s = clock() - start
    start = clock()
    cider = CiderD(ids)
    df_s = clock() - start
    start = clock()
    for key, refs in enumerate(ids):
        cider.add_references(key, refs[1:])
    refs_s = clock() - start
    print(f"{len(ids)} images, {sum(map(len, ids))} references: tokenise+ids {tokenize_s:.1f} s, "
          f"document frequencies {df_s:.1f} s, reference vectors {refs_s:.1f} s (once per run)")

    count = min(args.images, len(ids))
    candidates, keys = [refs[0] for refs in ids[:count]], list(range(count))
    start, wall = clock(), time.perf_counter()
    for i in range(0, count, args.batch):
        cider.score(candidates[i : i + args.batch], keys[i : i + args.batch])
    ours_s, wall = clock() - start, time.perf_counter() - wall
    print(f"captioner.training.rewards.CiderD: {count} captions in {ours_s:.2f} CPU s = {count / ours_s:,.0f} captions/s "
          f"({1000 * ours_s / (count / args.batch):.1f} ms per batch of {args.batch}; wall {wall:.2f} s)")
    bleu = Bleu4()
    for key, refs in enumerate(ids[:count]):
        bleu.add_references(key, refs[1:])
    start = clock()
    for i in range(0, count, args.batch):
        cider.score(candidates[i : i + args.batch], keys[i : i + args.batch]) + 0.5 * bleu.score(
            candidates[i : i + args.batch], keys[i : i + args.batch]
        )
    both_s = clock() - start
    print(f"CIDEr-D + 0.5 BLEU-4: {count / both_s:,.0f} captions/s")
    bench_vectorised(ids, count, args.batch)

    words = [[" ".join(tokenize(c)) for c in captions] for captions in texts[:count]]
    start = clock()
    for i in range(0, count, args.batch):
        scorer = CiderScorer(n=4, sigma=6.0)
        for refs in words[i : i + args.batch]:
            scorer += (refs[0], refs[1:])
        scorer.compute_score()
    theirs_s = clock() - start
    print(f"pycocoevalcap CiderScorer per batch: {count} captions in {theirs_s:.2f} CPU s = {count / theirs_s:,.0f} captions/s")


def bench_vectorised(ids: list, count: int, batch: int) -> None:
    """The Python CiderD and the vectorised table side by side on the same batches: both with the
    held-out references (each image's first caption is the candidate) as the df corpus."""
    from captioner.training.reward_table import ReferenceTable, padded
    from captioner.training.rewards import CiderD

    held_out = [refs[1:] for refs in ids]
    cider = CiderD(held_out)
    start = clock()
    for key, refs in enumerate(held_out):
        cider.add_references(key, refs)
    python_build_s = clock() - start
    start = clock()
    table = ReferenceTable.build(held_out)
    table_build_s = clock() - start
    print(f"reference set-up for {len(held_out)} images: Python vectors {python_build_s:.1f} CPU s (plus the df above), "
          f"table (df included) {table_build_s:.1f} CPU s, {table.nbytes() / 2**20:.0f} MiB")
    candidates = [refs[0] for refs in ids[:count]]
    python_s = table_s = 0.0
    worst = 0.0
    for i in range(0, count, batch):
        tokens, lengths = padded(candidates[i : i + batch])  # (C, L), (C,): SCST hands the reward tensors
        keys = torch.arange(i, min(i + batch, count))  # (C,)
        start = clock()
        want = cider.score(candidates[i : i + batch], keys.tolist())
        python_s += clock() - start
        start = clock()
        got = table.score(tokens, lengths, keys)
        table_s += clock() - start
        worst = max(worst, float(np.abs(got.numpy() - want).max()))
    batches = -(-count // batch)
    print(f"reward per batch of {batch}: Python CiderD {1000 * python_s / batches:.1f} ms, "
          f"vectorised table {1000 * table_s / batches:.1f} ms (CPU, float64, 1 thread); "
          f"largest difference {worst:.1e}")


def bench_syncs(args: argparse.Namespace) -> None:
    """Syncs per SCST step of the checkout at args.root (its captioner), both decoders, both baselines."""
    import tempfile

    use_checkout(args.root)
    import pytest
    from helpers import WORDS, tiny_model
    from PIL import Image
    from test_sync import DeviceSimulation, watch_reads
    from torch.utils.data import DataLoader

    from captioner.core.config import ScstConfig
    from captioner.data.batching import CaptionDataset, collate_captions
    from captioner.data.images import ImageTransform
    from captioner.data.records import ImageRecord
    from captioner.training.scst import SelfCritical

    folder = Path(tempfile.mkdtemp())
    records = []
    for i in range(16):
        path = folder / f"{i}.png"
        Image.new("RGB", (32, 32), (i * 9, 50, 90)).save(path)
        captions = tuple(" ".join(WORDS[(i + j + k) % len(WORDS)] for k in range(5 + (i + j) % 6)) for j in range(5))
        records.append(ImageRecord(i, path, captions))
    for decoder in ("lstm", "transformer"):
        for baseline in ("greedy", "mean"):
            model = tiny_model(f"model.decoder.type={decoder}").train()
            dataset = CaptionDataset(records, model.vocab, ImageTransform(32, train=True), 20, "all")
            objective = SelfCritical(ScstConfig(samples=5, baseline=baseline, max_length=16), model.vocab,
                                     [r.captions for r in dataset.records])
            sim = DeviceSimulation()
            patch = pytest.MonkeyPatch()
            watch_reads(sim, patch)
            table = getattr(objective.reward, "table", None)  # the vectorised reward's: device tensors
            batch = next(iter(DataLoader(dataset, batch_size=8, collate_fn=collate_captions)))
            with sim:
                sim.mark(*model.parameters(), *model.buffers(), batch.images)
                if table is not None:
                    sim.mark(*(getattr(table, f) for f in table.__dataclass_fields__ if f != "meta"))
                loss, _ = objective(model, batch, model.config, encoded=False)
                loss.backward()
            patch.undo()
            reads = sum(s.startswith(("aten._local_scalar_dense", "tolist", "numpy", "__array__")) for s in sim.syncs)
            kinds = Counter(s.split(" at ")[0] for s in sim.syncs)
            print(f"{args.root}: {decoder} {baseline}: {len(sim.syncs)} syncs per step ({reads} value reads); "
                  f"{dict(kinds.most_common(4))}")


def use_checkout(root: Path) -> None:
    """Import `captioner` from the checkout at root (today's or an older one) and the tests' helpers."""
    import sys

    if not (root / "captioner" / "__init__.py").is_file():
        sys.exit(f"error: --root {root}: no captioner package there (it names a checkout's folder, e.g. /tmp/old)")
    sys.path[:0] = [str(root), str(Path(__file__).resolve().parents[1] / "tests")]
    for name in [m for m in sys.modules if m == "captioner" or m.startswith("captioner.")]:
        del sys.modules[name]
    import captioner

    assert captioner.__file__.startswith(str(root)), captioner.__file__


def bench_step(args: argparse.Namespace) -> None:
    use_checkout(args.root)
    from captioner.core.config import apply_overrides, load_config
    from captioner.data.batching import CaptionBatch
    from captioner.data.datasets import load_split
    from captioner.models.build import build_model
    from captioner.models.checkpoint import checkpoint_config, load_captioner
    from captioner.text.vocab import Vocabulary
    from captioner.training.scst import SelfCritical

    if args.checkpoint.suffix in (".yaml", ".yml"):  # an untrained model of the config: captions run to max_length
        config = load_config(args.checkpoint, ["model.encoder.pretrained=false", *args.data])
        records = load_split(config.data, "train")
        torch.manual_seed(0)
        model = build_model(config, Vocabulary.build((c for r in records for c in r.captions), config.data.min_word_count))
    else:
        model = load_captioner(args.checkpoint)
        config = apply_overrides(checkpoint_config(args.checkpoint), args.data, only="data.")
        records = load_split(config.data, "train")
    if args.baseline:
        config.scst.baseline = args.baseline
    start = clock()
    objective = SelfCritical(config.scst, model.vocab, [r.captions for r in records])
    setup_s = clock() - start
    feats, _ = model.encoder.stored_part(torch.zeros(1, 3, config.data.image_size, config.data.image_size))  # (1, n, C): a stored row's shape
    B = config.data.batch_size
    optimizer = torch.optim.AdamW(model.decoder.parameters(), lr=config.train.lr)
    model.train()
    times, parts = [], []
    generator = torch.Generator().manual_seed(0)
    for step in range(args.steps + 1):
        images = torch.randn(B, *feats.shape[1:], generator=generator)  # (B, N, D)
        indices = torch.randint(len(records), (B,), generator=generator)  # (B,)
        batch = CaptionBatch(images, torch.zeros(B, 2, dtype=torch.long), torch.full((B,), 2), torch.arange(B), indices)
        reward_before = objective.reward_seconds
        start, cpu = time.perf_counter(), clock()
        loss, logged = objective(model, batch, config, encoded=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        elapsed, cpu = time.perf_counter() - start, clock() - cpu
        if step:  # the first step warms up allocators and caches
            times.append((elapsed, objective.reward_seconds - reward_before, cpu))
            parts.append(logged)
    total = np.array([t for t, _, _ in times])  # wall seconds per step
    reward = np.array([r for _, r, _ in times])  # wall seconds in the reward
    cpu = np.array([c for _, _, c in times])  # CPU seconds per step
    print(f"{args.checkpoint}: {config.model.decoder.type}, {B} images x {config.scst.samples} samples, "
          f"baseline {config.scst.baseline}, temperature {config.scst.temperature}, max_length {config.scst.max_length}; "
          f"reward set-up {setup_s:.2f} s")
    print(f"SCST step: {cpu.mean():.2f} CPU s, {total.mean():.2f} wall s (median {np.median(total):.2f}), reward {reward.mean() * 1000:.1f} ms wall "
          f"= {100 * reward.sum() / total.sum():.1f}% of the step; "
          f"{len(records) // B} steps per epoch -> {cpu.mean() * (len(records) // B):.0f} CPU s of training per epoch")
    keys = parts[0].keys()
    print("  " + ", ".join(f"{k} {np.mean([p[k] for p in parts]):.3f}" for k in keys))


def main() -> None:
    shared = SHARED_DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    reward = commands.add_parser("reward")
    reward.add_argument("annotations", nargs="?", type=Path, default=shared / "coco" / "captions_val2014.json")
    reward.add_argument("--corpus", type=int, default=0, help="images whose references make the corpus (0: all)")
    reward.add_argument("--images", type=int, default=5000, help="candidates scored (one per image)")
    reward.add_argument("--batch", type=int, default=160, help="captions per reward call (32 images x 5 samples)")
    step = commands.add_parser("step")
    step.add_argument("checkpoint", type=Path, help="a checkpoint, or a config (.yaml) for an untrained model of it")
    step.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout whose captioner runs")
    step.add_argument("--steps", type=int, default=8)
    step.add_argument("--baseline", choices=("greedy", "mean"), default=None, help="default: the checkpoint's scst.baseline")
    step.add_argument("--data", nargs="*", default=[], metavar="data.KEY=VALUE",
                      help="where the data is here, e.g. data.root=../shared/data/flickr8k data.image_root=../shared/data/flickr8k_224/images")
    syncs = commands.add_parser("syncs")
    syncs.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    {"reward": bench_reward, "step": bench_step, "syncs": bench_syncs}[args.command](args)


if __name__ == "__main__":
    main()
