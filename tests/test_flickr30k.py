"""Flickr30k through Karpathy's dataset_flickr30k.json, on a miniature tree built here: the layout
of configs/flickr30k_lstm_lite0.yaml (the file beside a flickr30k-images/ folder, entries without
`filepath`), each split's images and captions, malformed entries refused in one line, and a
one-epoch `captioner train` of the config itself with a tiny decoder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import REPO
from PIL import Image

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.errors import DatasetError
from captioner.data.coco import load_karpathy
from captioner.data.datasets import load_split
from captioner.models.checkpoint import load_captioner

CONFIG = REPO / "configs" / "flickr30k_lstm_lite0.yaml"
SPLITS = {"train": 6, "val": 2, "test": 2}  # Karpathy's: 29,000 / 1,014 / 1,000
WORDS = "man woman dog child bike street water grass".split()


def caption(imgid: int, k: int) -> str:
    return f"a {WORDS[(imgid + k) % len(WORDS)]} near the {WORDS[(imgid + 2 * k + 1) % len(WORDS)]}"


def flickr30k_entries() -> list[dict]:
    """Entries as in Karpathy's file: numeric Flickr file names, five sentences each with tokens,
    raw, imgid and sentid; no filepath, no cocoid."""
    entries = []
    for imgid, split in enumerate(s for s, n in SPLITS.items() for _ in range(n)):
        sentids = list(range(5 * imgid, 5 * imgid + 5))
        sentences = [{"tokens": caption(imgid, k).split(), "raw": caption(imgid, k).capitalize() + " .", "imgid": imgid,
                      "sentid": sentid}
                     for k, sentid in enumerate(sentids)]
        entries.append({"filename": f"{1000092795 + imgid}.jpg", "imgid": imgid, "split": split, "sentids": sentids,
                        "sentences": sentences})
    return entries


def write_tree(root: Path, entries: list[dict]) -> Path:
    """root/dataset_flickr30k.json and root/flickr30k-images/<filename> (small generated photos)."""
    images = root / "flickr30k-images"
    images.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if isinstance(entry, dict) and "filename" in entry:
            shade = 20 * (entry.get("imgid", 0) % 12)
            Image.new("RGB", (80, 60), (shade, 255 - shade, 90)).save(images / entry["filename"])
    split_file = root / "dataset_flickr30k.json"
    split_file.write_text(json.dumps({"images": entries, "dataset": "flickr30k"}))
    return split_file


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    write_tree(tmp_path / "flickr30k", flickr30k_entries())
    return tmp_path / "flickr30k"


def tree_overrides(root: Path) -> list[str]:
    return [f"data.root={root}", f"data.karpathy_file={root / 'dataset_flickr30k.json'}",
            f"data.image_root={root / 'flickr30k-images'}"]


def test_the_config_names_the_karpathy_layout() -> None:
    config = load_config(CONFIG)
    assert config.data.dataset == "karpathy"
    assert Path(config.data.karpathy_file).name == "dataset_flickr30k.json"
    assert Path(config.data.image_root).name == "flickr30k-images"
    assert Path(config.data.karpathy_file).parent == Path(config.data.root) == Path(config.data.image_root).parent


def test_each_split_loads_with_its_images_and_captions(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(CONFIG, tree_overrides(tree))
    entries = flickr30k_entries()
    with caplog.at_level(logging.INFO, logger="captioner.data.coco"):
        by_split = {split: load_split(config.data, split) for split in SPLITS}
    assert {split: len(records) for split, records in by_split.items()} == SPLITS
    assert f"{tree / 'dataset_flickr30k.json'}: train 6 (6 train + 0 restval), val 2, test 2 images" in caplog.messages
    for split, records in by_split.items():
        expected = [e for e in entries if e["split"] == split]
        assert [r.image_id for r in records] == [e["imgid"] for e in expected]
        assert [r.path for r in records] == [tree / "flickr30k-images" / e["filename"] for e in expected]
        assert [r.captions for r in records] == [tuple(s["raw"] for s in e["sentences"]) for e in expected]
    assert by_split["test"][0].captions[0] == caption(8, 0).capitalize() + " ."


@pytest.mark.parametrize(("broken", "message"), [
    ({"sentences": None}, r"images\[3\] has no 'sentences'$"),
    ({"split": "dev"}, r"images\[3\]: unknown split 'dev' \(one of train, restval, val, test\)$"),
    ({"sentences": []}, r"images\[3\]: 'sentences' must be a non-empty list$"),
    ({"sentences": [{"tokens": [1, 2]}]},
     r"images\[3\]\.sentences\[0\]: needs a 'raw' string or a 'tokens' list of strings$"),
    ({"imgid": 0}, r"images\[3\] repeats image id 0 of images\[0\]$"),
])
def test_a_malformed_entry_is_refused_in_one_line_naming_file_and_entry(tmp_path: Path, broken: dict,
                                                                        message: str) -> None:
    entries = flickr30k_entries()
    for key, value in broken.items():
        if value is None:
            del entries[3][key]
        else:
            entries[3][key] = value
    split_file = write_tree(tmp_path, entries)
    with pytest.raises(DatasetError, match=r"^" + str(split_file).replace(".", r"\.") + ": " + message) as error:
        load_karpathy(split_file, tmp_path / "flickr30k-images", "train")
    assert "\n" not in str(error.value)


def test_a_missing_photo_is_skipped_or_stops_a_strict_load(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = tree / "flickr30k-images" / "1000092797.jpg"  # imgid 2, train
    missing.unlink()
    with pytest.raises(
            DatasetError,
            match=r"1 of 6 images are missing on disk .*: 16.7%, more than data.max_missing_fraction \(0.05\)"):
        # a sixth of the split gone: stop by default
        load_split(load_config(CONFIG, tree_overrides(tree)).data, "train")
    config = load_config(CONFIG, [*tree_overrides(tree), "data.max_missing_fraction=1"])
    with caplog.at_level(logging.WARNING, logger="captioner.data.records"):
        assert [r.image_id for r in load_split(config.data, "train")] == [0, 1, 3, 4, 5]
    assert caplog.messages == [
        f"{tree / 'dataset_flickr30k.json'}: 1 of 6 images are missing on disk (e.g. {missing}); skipping them"]
    strict = load_config(CONFIG, [*tree_overrides(tree), "data.strict=true"])
    with pytest.raises(DatasetError, match=(r"dataset_flickr30k\.json: 1 of 6 images are missing on disk \(e\.g\. "
                                            r".*1000092797\.jpg\); strict mode is on$")):
        load_split(strict.data, "train")


def test_one_epoch_of_the_flickr30k_config_on_the_miniature_tree(tree: Path, tmp_path: Path) -> None:
    """The config as shipped (frozen Lite0 with its packaged weights, the feature store, beam
    validation), shrunk: 64 px photos, a tiny LSTM, one epoch."""
    torch.set_num_threads(1)
    out = tmp_path / "run"
    tiny = ["data.image_size=64", "data.batch_size=4", "data.min_word_count=1", "model.decoder.embed_dim=16",
            "model.decoder.hidden_dim=24", "model.decoder.attention_dim=12", "train.epochs=1", "train.warmup_steps=1"]
    assert main(["train", str(CONFIG), *tree_overrides(tree), *tiny, f"train.out_dir={out}"]) == 0
    model = load_captioner(out / "best.pt")
    assert model.config.encoder.name == "efficientnet_lite0" and model.config.encoder.pretrained
    train_words = {w for e in flickr30k_entries() if e["split"] == "train" for s in e["sentences"] for w in s["tokens"]}
    assert set(model.vocab.words[4:]) == train_words  # the vocabulary of the train captions, nothing else
    assert (out / "features" / "train.npy").is_file() and (out / "features" / "val.npy").is_file()
