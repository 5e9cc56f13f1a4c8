"""A dataset config -> the records of one split: shapes (generated on first use), COCO, Karpathy splits, Flickr8k,
an image folder, a Hugging Face dataset on disk, WebDataset shards (training streams those: data/streaming.py).
`dataset_stats` (`captioner data stats`): images, captions, caption lengths and vocabulary size of records."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from captioner.core.config_sections import DataConfig
from captioner.core.errors import DatasetError
from captioner.core.files import make_folder
from captioner.core.machine_cache import folder_held
from captioner.data.coco import coco_split_files, load_coco_captions, load_karpathy, split_coco_val
from captioner.data.flickr8k import load_flickr8k
from captioner.data.imagefolder import load_hf_dataset, load_imagefolder, seeded_split_files, seeded_split_rows
from captioner.data.records import ImageRecord
from captioner.data.shapes import SPLITS, check_shapes_options, finished_world, generate_shapes, holds_a_users_files
from captioner.text.vocab import tokenize

log = logging.getLogger(__name__)


def load_split(config: DataConfig, split: str, check_images: bool = True) -> list[ImageRecord]:
    """The records of `split` (train, val or test) of the dataset `config` describes."""
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}: use train, val or test")
    root = Path(config.root)
    policy = {"strict": config.strict, "max_missing": config.max_missing_fraction}  # listed images not on disk
    if config.dataset == "shapes":
        ensure_shapes(config)
        return load_coco_captions(root / f"captions_{split}.json", root / split, check_images, **policy)
    if config.dataset == "coco":
        annotations, images = coco_split_files(root, config.year, split)
        image_root = Path(config.image_root) / images.name if config.image_root else images
        records = load_coco_captions(annotations, image_root, check_images, **policy)
        return split_coco_val(records, split)
    if config.dataset == "karpathy":
        if config.karpathy_file is None:  # a model's stored config may have had it set aside
            raise DatasetError("data.karpathy_file is not set: the Karpathy split file of this dataset is not known")
        image_root = Path(config.image_root) if config.image_root else root
        return load_karpathy(config.karpathy_file, image_root, split, check_images, **policy)
    if config.dataset == "flickr8k":
        return load_flickr8k(root, split, config.image_root, check_images, **policy)
    if config.dataset == "imagefolder":
        drawn = (config.caption_column, config.val_fraction, config.test_fraction, config.split_seed)
        return load_imagefolder(root, split, *drawn, check_images, **policy)
    if config.dataset == "hf":  # `datasets`, an extra, is imported when a dataset is opened
        return load_hf_dataset(root, split, config.image_column, config.caption_column, config.val_fraction,
                               config.test_fraction, config.split_seed, image_root=config.image_root)
    if config.dataset == "webdataset":
        from captioner.data.bounded_tar import shard_limits
        from captioner.data.shards import load_shard_records, open_shard_set  # webdataset is an extra

        shards = open_shard_set(split_shards(config, split), f"data.{split}_shards", shard_limits(config))
        return load_shard_records(shards, split, keep_images=check_images)
    raise DatasetError(f"unknown dataset {config.dataset!r}")


def split_places(config: DataConfig, split: str) -> tuple[str, ...]:
    """The data keys naming the places `load_split(config, split)` reads (none may be set aside)."""
    places = {"shapes": ("root",), "coco": ("root", "image_root"),
              "karpathy": ("karpathy_file", "image_root", "root"), "flickr8k": ("root", "image_root"),
              "imagefolder": ("root",), "hf": ("root", "image_root"), "webdataset": (f"{split}_shards",)}
    return places[config.dataset]


def split_shards(config: DataConfig, split: str) -> str:
    """The brace pattern of a webdataset split's shards (data.train_shards, val_shards, test_shards)."""
    pattern = getattr(config, f"{split}_shards")
    if not pattern:
        raise DatasetError(f"data.{split}_shards is not set: the {split} split of these shards is not known")
    return pattern


def seeded_split_record(config: DataConfig) -> dict | None:
    """What training writes to splits.json when the run drew the splits (`imagefolder.seeded_split`), else None."""
    if config.dataset == "imagefolder":
        splits = seeded_split_files(config.root, config.caption_column, config.val_fraction, config.test_fraction,
                                    config.split_seed)
    elif config.dataset == "hf":
        splits = seeded_split_rows(config.root, config.image_column, config.caption_column, config.val_fraction,
                                   config.test_fraction, config.split_seed)
    else:
        return None
    if splits is None:
        return None
    return {"dataset": config.dataset, "root": config.root, "val_fraction": config.val_fraction,
            "test_fraction": config.test_fraction, "split_seed": config.split_seed, **{s: splits[s] for s in SPLITS}}


def world_held(root: Path) -> contextlib.AbstractContextManager[None]:
    """The shapes world's folder `root` held while one process generates into it: another (a second first run on
    the default data/shapes, say) waits, saying so, then finds the world finished, instead of generating beside the
    first and removing its caption files as those of a world cut short."""
    return folder_held("shapes", root, f"generating the shapes world into {root}", log)


def ensure_shapes(config: DataConfig) -> None:
    """Generate the shapes world into `config.root` on first use; a root that is a file or cannot be made, or a
    count or size the generator refuses (named as its data key), is one line, before any image is drawn."""
    root = Path(config.root)
    if finished_world(root):
        return
    check_shapes_options(config.shapes_num_train, config.shapes_num_val, config.shapes_num_test, config.image_size,
                         config.shapes_seed, "jpg", from_config=True)
    make_folder(root, f"data.root={root}", DatasetError)
    with world_held(root):
        if finished_world(root):  # generated by another process while this one waited
            return
        # Never write into a user's folder unasked.
        if holds_a_users_files(root):
            raise DatasetError(f"{root}: no shapes caption files (captions_train.json, ...) here, and the folder "
                               "holds other files: point data.root at a new or empty folder, or at a world made by "
                               "captioner data shapes --out DIR")
        log.info("generating the shapes world into %s", root)
        generate_shapes(root, config.shapes_num_train, config.shapes_num_val, config.shapes_num_test,
                        image_size=config.image_size, seed=config.shapes_seed)


def dataset_stats(records: list[ImageRecord], min_count: int = 5) -> dict[str, float]:
    """Each caption is tokenised once (the tokenizer is most of the time: 200,000 COCO captions)."""
    tokens = [tokenize(c) for r in records for c in r.captions]
    lengths = np.array([len(t) for t in tokens])
    counts = Counter(word for caption in tokens for word in caption)
    stats: dict[str, float] = {
        "images": len(records),
        "captions": int(lengths.size),
        "captions per image": lengths.size / max(1, len(records)),
        "words (all)": len(counts),
        # the words Vocabulary.build keeps, without <pad> <bos> <eos> <unk>
        f"vocabulary (min count {min_count})": sum(c >= min_count for c in counts.values()),
    }
    if lengths.size:
        for p in (5, 25, 50, 75, 95, 99):
            stats[f"caption length p{p}"] = float(np.percentile(lengths, p))
        stats["caption length max"] = int(lengths.max())
    return stats


def format_table(rows: dict[str, float], title: str) -> str:
    width = max(len(k) for k in rows)
    texts = {key: f"{value:,}" if isinstance(value, int) else f"{value:,.2f}" for key, value in rows.items()}
    return "\n".join([title, "-" * (width + 14), *(f"{key:<{width}}  {text:>12}" for key, text in texts.items())])
