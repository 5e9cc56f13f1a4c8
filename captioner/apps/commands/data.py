"""`captioner data shapes|coco|flickr8k|stats|shards`: generate, download, describe or shard a dataset."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from captioner.apps.arguments import positive_int, said_by_an_error, split_names
from captioner.apps.prerequisites import require_data, writable_folder
from captioner.core.config_sections import SHAPES_MIN_IMAGE_SIZE, DataConfig, key_spec
from captioner.core.errors import CaptionerError



def add_parser(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="generate, download or describe datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    shapes = data_commands.add_parser("shapes", help="generate the synthetic shapes world in COCO format")
    shapes.add_argument("--out", required=True,
                        help="output folder, new or empty (a world cut short there is generated again)")
    shapes.add_argument("--num-train", type=int, default=4000, help="training images")
    shapes.add_argument("--num-val", type=int, default=250, help="validation images")
    shapes.add_argument("--num-test", type=int, default=500, help="test images")
    shapes.add_argument("--image-size", type=int, default=128,
                        help=f"side of the square images, px ({SHAPES_MIN_IMAGE_SIZE} to "
                             f"{key_spec(DataConfig, 'image_size').le:g}; the world's pixels are bounded too)")
    shapes.add_argument("--seed", type=int, default=0, help="the same seed gives the same world")
    shapes.add_argument("--format", choices=("jpg", "png"), default="jpg", help="image file format")
    shapes.add_argument("--quiet", action="store_true", help="no progress bar")
    shapes.set_defaults(func=run_shapes)

    coco = data_commands.add_parser("coco", help="download the official COCO images and captions (resumable)")
    coco.add_argument("--root", required=True, help="folder to download into; the config's data.root")
    coco.add_argument("--year", type=int, choices=(2014, 2017), default=2014, help="COCO release")
    coco.add_argument("--karpathy", action="store_true", help="also fetch Karpathy's split files")
    coco.add_argument("--mirror", help="base URL of a mirror to use instead of the official hosts")
    coco.set_defaults(func=run_coco)

    flickr8k = data_commands.add_parser("flickr8k",
                                        help="download the Flickr8k photos and captions (~1.1 GB, resumable)")
    flickr8k.add_argument("--root", required=True, help="folder to unpack into; the config's data.root")
    flickr8k.add_argument("--mirror", help="base URL of a mirror to use instead of github.com")
    flickr8k.set_defaults(func=run_flickr8k)

    stats = data_commands.add_parser("stats", help="images, captions, caption lengths, vocabulary size")
    source = stats.add_mutually_exclusive_group()
    source.add_argument("--coco", help="a COCO-format caption file")
    source.add_argument("--karpathy", help="a Karpathy split file (dataset_*.json)")
    source.add_argument("--flickr8k", help="a folder with Flickr8k.token.txt and the split files")
    source.add_argument("--imagefolder",
                        help="a folder of images with metadata.jsonl or metadata.csv (docs/training.md)")
    source.add_argument("--hf", help="a Hugging Face dataset on disk: a save_to_disk folder or Parquet files")
    stats.add_argument("config", nargs="?", help="or a training config")
    stats.add_argument("overrides", nargs="*", help="section.key=value")
    stats.add_argument("--min-count", type=positive_int, default=5,  # at least 1, as data.min_word_count
                       help="the vocabulary counts words seen at least this often")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.set_defaults(func=run_stats)

    shards = data_commands.add_parser("shards", help="write a dataset as WebDataset shards (img2dataset's layout), "
                                                     "e.g. to move it to object storage")
    layout = shards.add_mutually_exclusive_group()
    layout.add_argument("--flickr8k", help="a folder with Flickr8k.token.txt and the split files")
    layout.add_argument("--imagefolder", help="a folder of images with metadata.jsonl or metadata.csv")
    layout.add_argument("--hf", help="a Hugging Face dataset on disk: a save_to_disk folder or Parquet files")
    shards.add_argument("config", nargs="?", help="or a training config (any dataset it reads: COCO, Karpathy, ...)")
    shards.add_argument("overrides", nargs="*", help="section.key=value")
    shards.add_argument("--out", required=True, help="output folder: one subfolder of shards per split")
    shards.add_argument("--splits", default="train,val,test", help="comma-separated splits to write")
    shards.add_argument("--max-count", type=int, default=1000, help="samples per shard at most")
    shards.add_argument("--max-size", type=float, default=1e9,
                        help="bytes of images per shard, about (a shard closes past it)")
    shards.add_argument("--quiet", action="store_true", help="no progress bar")
    shards.set_defaults(func=run_shards)


HF_PARQUET = "datasets.packaged_modules.parquet.parquet"  # logs each unreadable Parquet file's error


def run_shapes(args: argparse.Namespace) -> int:
    from captioner.data.datasets import world_held
    from captioner.data.shapes import check_shapes_options, generate_shapes

    # before the folder is made: a refused option leaves nothing behind
    check_shapes_options(args.num_train, args.num_val, args.num_test, args.image_size, args.seed, args.format)
    writable_folder(args.out, "data shapes --out")
    with world_held(Path(args.out)):  # another process generating into it: waited for, then its world refused
        refuse_a_used_folder(Path(args.out))
        start = time.time()
        counts = generate_shapes(args.out, args.num_train, args.num_val, args.num_test, args.image_size, args.seed,
                                 args.format, progress=not args.quiet)
    total = sum(counts.values())
    seconds = time.time() - start
    print(f"wrote {total} images ({', '.join(f'{k} {v}' for k, v in counts.items())}) to {args.out} "
          f"in {seconds:.1f}s ({total / max(seconds, 1e-9):.0f} images/s)")
    return 0


def refuse_a_used_folder(out: Path) -> None:
    """data shapes --out: a new or empty folder, or a world the generator cut short (made again, as training does).
    A finished world is kept: written over, its images would mix with the new ones and a model trained on it
    would be scored on another test split. Nor are the world's files put beside a user's own."""
    from captioner.data.shapes import finished_world, holds_a_users_files

    if finished_world(out):
        raise CaptionerError(f"data shapes --out {out}: already holds a shapes world (captions_train.json, ...); "
                             "delete it or choose another folder")
    if holds_a_users_files(out):
        raise CaptionerError(f"data shapes --out {out}: not empty and not a shapes world; give a new or empty folder")


def run_coco(args: argparse.Namespace) -> int:
    from captioner.data.download import download_coco

    paths = download_coco(Path(args.root), str(args.year), karpathy=args.karpathy, mirror=args.mirror)
    print(f"COCO {args.year} ready under {args.root} ({len(paths)} archives extracted)")
    return 0


def run_flickr8k(args: argparse.Namespace) -> int:
    from captioner.data.download import FLICKR8K_FILES, download_flickr8k
    from captioner.data.flickr8k import default_image_folder, load_flickr8k
    from captioner.data.shapes import SPLITS

    root = Path(args.root)
    download_flickr8k(root, mirror=args.mirror)
    images = default_image_folder(root)
    # Loaded as training will load them, so the counts say what a run would find.
    counts = {split: len(load_flickr8k(root, split)) for split in SPLITS}
    print(f"Flickr8k ready under {root}: {', '.join(f.name for f in FLICKR8K_FILES)} (kept in {root / 'downloads'})")
    print(f"  captions and splits in {root}, {sum(1 for _ in images.glob('*.jpg')):,} photos in {images}")
    print(f"  {', '.join(f'{split} {n:,}' for split, n in counts.items())} images with captions")
    print(f"use it with: data.root={root}   (e.g. captioner train configs/flickr8k_lstm_lite0.yaml data.root={root})")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from captioner.core.config_sections import DataConfig
    from captioner.data.coco import load_coco_captions, load_karpathy
    from captioner.data.datasets import dataset_stats, format_table, load_split
    from captioner.data.flickr8k import load_flickr8k
    from captioner.data.shapes import SPLITS

    start = time.time()
    shards = False
    if args.coco:
        records, source = load_coco_captions(args.coco, Path(args.coco).parent, check_images=False), args.coco
    elif args.karpathy:
        records = [r for s in SPLITS for r in load_karpathy(args.karpathy, ".", s, check_images=False)]
        source = args.karpathy
    elif args.flickr8k:
        require_data(DataConfig(dataset="flickr8k", root=args.flickr8k), ["train"], given_as="--flickr8k")
        records = [r for s in SPLITS for r in load_flickr8k(args.flickr8k, s, check_images=False)]
        source = args.flickr8k
    elif args.config or args.imagefolder or args.hf:
        data, source = named_dataset(args)
        if args.config:  # a folder named by its flag is refused by its loader, naming the folder
            require_data(data, list(SPLITS))
        shards = data.dataset == "webdataset"
        splits = [s for s in SPLITS if not shards or getattr(data, f"{s}_shards")]  # the shard splits the config names
        with said_by_an_error(HF_PARQUET):  # its reader's own error lines, said again by ours: ours alone
            records = [r for s in splits for r in load_split(data, s, check_images=False)]
    else:
        raise CaptionerError("data stats: give --coco FILE, --karpathy FILE, --flickr8k DIR, --imagefolder DIR, "
                             "--hf DIR or a CONFIG")
    stats = dataset_stats(records, args.min_count)
    if (args.flickr8k or args.config or args.imagefolder or args.hf) and not shards:  # shards hold their images
        from captioner.data.records import record_exists

        on_disk = sum(1 for r in records if record_exists(r))
        stats = {**stats, "images on disk": on_disk, "images missing": len(records) - on_disk}
    stats["seconds"] = round(time.time() - start, 2)
    print(json.dumps(stats, indent=1) if args.json else format_table(stats, source))
    return 0


def named_dataset(args: argparse.Namespace) -> tuple[DataConfig, str]:
    """The data config --flickr8k, --imagefolder or --hf DIR, or CONFIG, names (overrides applied), and its name."""
    from captioner.core.config import load_config

    if args.config and "=" in args.config and not Path(args.config).exists():  # `--imagefolder DIR k=v`: no config
        args.config, args.overrides = None, [args.config, *args.overrides]
    kinds = {"flickr8k": args.flickr8k, "imagefolder": args.imagefolder, "hf": args.hf}
    layout = [[f"data.dataset={kind}", f"data.root={root}"] for kind, root in kinds.items() if root]
    config = load_config(args.config, [*(layout[0] if layout else []), *args.overrides])
    return config.data, f"{config.data.dataset} ({args.config or config.data.root})"


def shard_splits(args: argparse.Namespace) -> list[str]:
    """The splits `data shards` writes, once its options are checked (before any data is read): --max-count and
    --max-size are at least 1 (nan and inf pass a comparison with 0), --splits names each split once (a split named
    twice is refused, not merged: train,val,val was likely meant as train,val,test)."""
    if args.max_count < 1:
        raise CaptionerError(f"data shards --max-count {args.max_count}: must be at least 1")
    if not (math.isfinite(args.max_size) and args.max_size >= 1):
        raise CaptionerError(f"data shards --max-size {args.max_size:g}: must be a finite number of bytes, at least 1")
    return split_names(args.splits, "data shards --splits")


def run_shards(args: argparse.Namespace) -> int:
    from captioner.data.datasets import load_split
    from captioner.data.shards import existing_shards, write_shards

    if not (args.config or args.flickr8k or args.imagefolder or args.hf):
        raise CaptionerError("data shards: give --flickr8k DIR, --imagefolder DIR, --hf DIR or a CONFIG")
    splits = shard_splits(args)
    data, source = named_dataset(args)
    if args.config or args.flickr8k:  # an image folder or HF dataset named by its flag: its loader names the folder
        require_data(data, splits, given_as="--flickr8k" if args.flickr8k else "data.root")
    out = Path(args.out)
    writable_folder(args.out, "data shards --out")  # the name as given: Path("") would be "."
    for split in splits:
        if existing_shards(out / split):
            raise CaptionerError(f"{out / split}: already holds {len(existing_shards(out / split))} shards; "
                                 "remove them or choose another --out")
    start = time.time()
    for split in splits:
        with said_by_an_error(HF_PARQUET):
            records = load_split(data, split)
        summary = write_shards(records, out / split, args.max_count, int(args.max_size), progress=not args.quiet,
                               description=f"shards {split}")
        size = sum(s["filesize"] for s in summary.shards)
        left_out = f", {len(summary.skipped)} unreadable images left out" if summary.skipped else ""
        print(f"{split}: {summary.samples:,} samples in {len(summary.shards)} shards ({size / 1e6:,.1f} MB) "
              f"in {out / split}{left_out}")
    print(f"{source} -> {out} in {time.time() - start:.1f} s; "
          "each split's shards.json lists its shards and their sample counts")
    return 0
