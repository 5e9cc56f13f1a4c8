"""Flickr8k on the real files in ../shared/data: the loader over the 224x224 copy of all 8,091
photographs finds the full official protocol, and `captioner train` runs one epoch of the shipped
config on a handful of those photos and their captions, laid out as `captioner data flickr8k`
unpacks them (photos in Flicker8k_Dataset/, no data.image_root)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import REPO, require

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.data.datasets import load_split
from captioner.data.flickr8k import SPLIT_FILES, TOKEN_FILE, read_token_file
from captioner.models.checkpoint import load_captioner
from captioner.text.tokenizer import tokenize

CONFIG = REPO / "configs" / "flickr8k_lstm_lite0.yaml"
# The official caption file names 8,092 images; one line group is a stray copy of another's
# captions under a name that is no photograph.
STRAY = "2258277193_586949ec62.jpg.1"


@pytest.fixture(scope="module")
def flickr8k_224(shared_data: Path) -> tuple[Path, Path]:
    """(caption and split files, the folder of all 8,091 photos at 224x224)."""
    text, images = shared_data / "flickr8k", shared_data / "flickr8k_224" / "images"
    require(images.is_dir() and (text / TOKEN_FILE).is_file(), f"Flickr8k files not found under {shared_data}")
    return text, images


def test_the_224_folder_holds_the_full_official_protocol(flickr8k_224: tuple[Path, Path]) -> None:
    text, images = flickr8k_224
    on_disk = {p.name for p in images.glob("*.jpg")}
    named = set(read_token_file(text / TOKEN_FILE))
    assert len(on_disk) == 8091
    assert named - on_disk == {STRAY} and on_disk <= named

    config = load_config(CONFIG, [f"data.root={text}", f"data.image_root={images}", "data.strict=true"])
    splits = {split: load_split(config.data, split) for split in SPLIT_FILES}  # strict: every photo there
    assert {split: len(records) for split, records in splits.items()} == {"train": 6000, "val": 1000, "test": 1000}
    for records in splits.values():
        assert all(len(r.captions) == 5 and r.path.parent == images for r in records)
    ids = [r.image_id for records in splits.values() for r in records]
    assert len(set(ids)) == 8000  # the splits are disjoint


def subset(text: Path, images: Path, root: Path, counts: dict[str, int]) -> dict[str, list[str]]:
    """Write a Flickr8k root of the first `counts[split]` photos of each official split: the
    caption and split files restricted to them, the photos in Flicker8k_Dataset/ as the official
    zip unpacks."""
    captions = read_token_file(text / TOKEN_FILE)
    (root / "Flicker8k_Dataset").mkdir(parents=True)
    chosen: dict[str, list[str]] = {}
    for split, count in counts.items():
        chosen[split] = (text / SPLIT_FILES[split]).read_text().split()[:count]
        (root / SPLIT_FILES[split]).write_text("".join(f"{name}\n" for name in chosen[split]))
        for name in chosen[split]:
            shutil.copy(images / name, root / "Flicker8k_Dataset" / name)
    lines = [f"{name}#{k}\t{caption}\n" for names in chosen.values() for name in names for k,
             caption in enumerate(captions[name])]
    (root / TOKEN_FILE).write_text("".join(lines))
    return chosen


def test_one_epoch_of_the_flickr8k_config_on_real_photos(flickr8k_224: tuple[Path, Path], tmp_path: Path) -> None:
    """The config as shipped (frozen ImageNet Lite0 with its packaged weights, 224 px, the feature
    store, beam validation) on 8 train and 2 val photos, with a tiny LSTM: seconds."""
    torch.set_num_threads(1)
    root, out = tmp_path / "flickr8k", tmp_path / "run"
    chosen = subset(*flickr8k_224, root, {"train": 8, "val": 2, "test": 2})
    tiny = ["data.batch_size=4", "data.min_word_count=1", "model.decoder.embed_dim=16", "model.decoder.hidden_dim=24",
            "model.decoder.attention_dim=12", "train.epochs=1", "train.warmup_steps=1", "decode.max_length=12"]

    assert main(["train", str(CONFIG), f"data.root={root}", *tiny, f"train.out_dir={out}"]) == 0

    model = load_captioner(out / "best.pt")
    assert model.config.encoder.name == "efficientnet_lite0" and model.config.encoder.pretrained
    captions = read_token_file(root / TOKEN_FILE)
    train_words = {w for name in chosen["train"] for c in captions[name] for w in tokenize(c)}
    assert set(model.vocab.words[4:]) == train_words  # the train captions' vocabulary, nothing else
    assert (out / "features" / "train.npy").is_file() and (out / "features" / "val.npy").is_file()
