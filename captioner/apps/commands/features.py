"""`captioner features CONFIG`: encode every split once into the fp16 feature store."""

from __future__ import annotations

import argparse
import time

from captioner.apps.arguments import add_device_argument, device_overrides, split_names


def add_parser(commands: argparse._SubParsersAction) -> None:
    features = commands.add_parser(
        "features", needs="a config, e.g. captioner features configs/flickr8k_lstm_lite0.yaml",
        help="encode the images once into the fp16 feature store (what the frozen blocks make)")
    features.add_argument("config", help="the training config whose encoder and data are encoded (YAML)")
    features.add_argument("overrides", nargs="*", help="section.key=value, e.g. data.image_size=448")
    features.add_argument("--splits", default="train,val,test", help="comma-separated (default: train,val,test)")
    features.add_argument("--out", help="store folder (default: data.feature_store, else <train.out_dir>/features)")
    add_device_argument(features, default=None)
    features.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Encode each split once into the fp16 feature store (resumes a stopped extraction)."""
    from captioner.apps.prerequisites import require_data, writable_folder
    from captioner.core.config import load_config
    from captioner.core.process_settings import resolve_device
    from captioner.data.datasets import load_split
    from captioner.data.image_transform import ImageTransform
    from captioner.data.shapes import SPLITS
    from captioner.core.files import size_text
    from captioner.data.store_extract import ensure_store
    from captioner.data.store_format import check_storable, store_dir
    from captioner.models.encoders import build_encoder, check_encoder_config

    config = load_config(args.config, [*args.overrides, *device_overrides(args)])
    if args.out:
        config.data.feature_store = args.out
    splits = split_names(args.splits, "features --splits", SPLITS)
    require_data(config.data, splits)
    check_encoder_config(config.model.encoder)  # an unknown backbone stops here, before any weights load
    directory = store_dir(config)
    given = "features --out" if args.out else "data.feature_store" if config.data.feature_store else "feature store"
    writable_folder(directory, given)  # a file there, or a place that cannot be made: said before any encoding
    device = resolve_device(config.train.device, "train.device")
    encoder = build_encoder(config.model.encoder).to(device)  # only the encoder runs: no decoder, no vocabulary
    check_storable(encoder)
    transform = ImageTransform(config.data.image_size)  # the evaluation transform, as a Captioner's
    for split in splits:
        start = time.time()
        records = load_split(config.data, split)
        store = ensure_store(encoder, transform, directory, split, records, config.data.batch_size,
                             config.data.num_workers)
        failed = len(store.failed_rows)
        print(f"{split}: {store.num_rows} images ({failed} failed to load) x {store.grid[0]}x{store.grid[1]} x "
              f"{store.feat_dim} fp16, {size_text(store.nbytes())}: {store.array_path} ({time.time() - start:.1f}s)")
    return 0
