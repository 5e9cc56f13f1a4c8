"""Resident memory and build time of the SCST reward's references at COCO scale: the Python
CaptionReward (dicts per image, built in every rank) against the reference table (flat arrays,
built once per node and memory-mapped by every rank).

    python benchmarks/bench_reward_memory.py [--images 113287] [--ranks 4] [--annotations captions_val2014.json]

The references are synthetic: 113,287 images (Karpathy's COCO train + restval) x 5 captions,
each caption drawn at random from COCO val2014's 202,654 human captions, so caption lengths and
the vocabulary are COCO's. Each measurement runs in a fresh process: RSS, and PSS / USS from
/proc/self/smaps_rollup (PSS divides a shared page among the processes mapping it; USS counts
only the process's private pages). `--ranks` processes map the same table at once, as the ranks
of a node do, and each touches every page of it before measuring.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import tempfile
import time
from pathlib import Path

from shared_data import SHARED_DATA

MiB = 2**20


def memory() -> dict[str, float]:
    """RSS, PSS and USS of this process in MiB (Linux /proc/self/smaps_rollup)."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024 / MiB
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def synthetic_references(annotations: Path, images: int, seed: int = 0) -> list[list[str]]:
    from captioner.evaluation.results_files import load_references

    pool = [c for captions in load_references(annotations).values() for c in captions]
    rng = random.Random(seed)
    return [[rng.choice(pool) for _ in range(5)] for _ in range(images)]


def load_inputs(folder: Path) -> tuple[object, list[list[str]]]:
    import pickle

    from captioner.text.vocab import Vocabulary

    with open(folder / "references.pkl", "rb") as f:
        references = pickle.load(f)
    return Vocabulary.load(folder / "vocab.json"), references


def old_reward(folder: Path, queue: mp.Queue) -> None:
    """The Python CaptionReward, as every rank builds it today."""
    import torch

    torch.set_num_threads(1)
    from captioner.training.rewards import CaptionReward

    vocab, references = load_inputs(folder)
    before = memory()
    start = time.process_time()
    reward = CaptionReward(vocab, references)
    seconds = time.process_time() - start
    after = memory()
    queue.put(("old", seconds, {k: after[k] - before[k] for k in after}, len(reward.references)))


def new_reward(folder: Path, queue: mp.Queue, barrier: mp.Barrier, rank: int) -> None:
    """The table through DeviceReward with a cache folder: the first process builds and saves it,
    the others wait for it and map it; every process then touches all of its pages."""
    import torch

    torch.set_num_threads(1)
    from captioner.training.reward_table import padded
    from captioner.training.rewards import DeviceReward

    vocab, references = load_inputs(folder)
    if rank > 0:
        barrier.wait()  # rank 0 builds first, as local rank 0 does on a node
    before = memory()
    start = time.process_time()
    reward = DeviceReward(vocab, references, cache_dir=folder / "cache")
    seconds = time.process_time() - start
    if rank == 0:
        barrier.wait()
    table = reward.table
    checksum = sum(float(getattr(table, name).double().sum()) for name in table.__dataclass_fields__)  # fault every page in
    tokens, lengths = padded([[vocab.index.get(w, vocab.unk_id) for w in c.lower().split()] + [vocab.eos_id] for c in references[0]])
    score = reward(tokens, lengths, torch.zeros(len(lengths), dtype=torch.long))
    barrier.wait()  # every rank has the table mapped and touched: measure together
    after = memory()
    queue.put((f"new rank {rank}", seconds, {k: after[k] - before[k] for k in after}, (checksum, float(score.mean()), table.nbytes(),
               table.to("cpu", torch.float32).nbytes())))
    barrier.wait()


def main() -> None:
    shared = SHARED_DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=113287)
    parser.add_argument("--ranks", type=int, default=4, help="processes mapping the same table at once")
    parser.add_argument("--annotations", type=Path, default=shared / "coco" / "captions_val2014.json")
    parser.add_argument("--skip-old", action="store_true", help="only the table (the Python reward takes minutes and GBs)")
    args = parser.parse_args()
    import pickle

    from captioner.text.vocab import Vocabulary

    folder = Path(tempfile.mkdtemp(prefix="reward_memory_"))
    references = synthetic_references(args.annotations, args.images)
    vocab = Vocabulary.build((c for captions in references for c in captions), 5)
    vocab.save(folder / "vocab.json")
    with open(folder / "references.pkl", "wb") as f:
        pickle.dump(references, f)
    print(f"{args.images} images x 5 captions resampled from {args.annotations.name}; vocabulary {len(vocab)} words; in {folder}")

    context = mp.get_context("spawn")
    queue = context.Queue()
    if not args.skip_old:
        process = context.Process(target=old_reward, args=(folder, queue))
        process.start()
        _, seconds, grown, _ = queue.get()
        process.join()
        print(f"CaptionReward (Python dicts), one rank: build {seconds:.0f} CPU s; RSS +{grown['rss']:,.0f} MiB, "
              f"PSS +{grown['pss']:,.0f} MiB, USS +{grown['uss']:,.0f} MiB per rank "
              f"-> x8 ranks: {8 * grown['uss'] / 1024:.1f} GiB per node")
    barrier = context.Barrier(args.ranks)
    processes = [context.Process(target=new_reward, args=(folder, queue, barrier, rank)) for rank in range(args.ranks)]
    for process in processes:
        process.start()
    results = sorted(queue.get() for _ in processes)
    for process in processes:
        process.join()
    files = sum(p.stat().st_size for p in (folder / "cache").rglob("*.npy"))
    for name, seconds, grown, (checksum, score, nbytes, nbytes32) in results:
        print(f"ReferenceTable, {name}: {'build + save' if name.endswith(' 0') else 'map'} {seconds:.1f} CPU s; "
              f"RSS +{grown['rss']:,.0f} MiB, PSS +{grown['pss']:,.0f} MiB, USS +{grown['uss']:,.0f} MiB (checksum {checksum:.6e})")
    print(f"table files {files / MiB:,.0f} MiB on disk (page cache, shared by the {args.ranks} processes); "
          f"on a GPU {nbytes32 / MiB:,.0f} MiB per process (float32 weights; {nbytes / MiB:,.0f} MiB in float64)")


if __name__ == "__main__":
    main()
