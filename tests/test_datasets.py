"""Dataset loaders (COCO format, Karpathy, Flickr8k), missing images, batching with bad files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.errors import DatasetError
from captioner.data.batching import CaptionDataset, collate_captions
from captioner.data.coco import load_coco_captions, load_karpathy
from captioner.data.datasets import load_split
from captioner.data.flickr8k import load_flickr8k
from captioner.data.image_transform import ImageTransform
from captioner.text.vocab import Vocabulary


def write_images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.new("RGB", (20, 16), (10 * i, 100, 200)).save(folder / name)


def test_karpathy_format(tmp_path: Path) -> None:
    entries = []
    for i, split in enumerate(["train", "restval", "val", "test", "test"]):
        entries.append({
            "filepath": "val2014" if split != "train" else "train2014",
            "filename": f"img{i}.jpg",
            "imgid": i,
            "cocoid": 1000 + i,
            "split": split,
            "sentences": [{"raw": f"A photo number {i} .", "tokens": ["a", "photo"]}, {"tokens": ["second", "one"]}],
        })
    split_file = tmp_path / "dataset_coco.json"
    split_file.write_text(json.dumps({"dataset": "coco", "images": entries}))
    write_images(tmp_path / "train2014", ["img0.jpg"])
    write_images(tmp_path / "val2014", [f"img{i}.jpg" for i in range(1, 5)])
    train = load_karpathy(split_file, tmp_path, "train")
    assert [r.image_id for r in train] == [1000, 1001]  # restval joins train
    assert train[0].captions == ("A photo number 0 .", "second one")
    assert train[1].path == tmp_path / "val2014" / "img1.jpg"
    assert len(load_karpathy(split_file, tmp_path, "test")) == 2
    # through the config, as training uses it
    config = load_config(None,
                         ["data.dataset=karpathy", f"data.karpathy_file={split_file}", f"data.image_root={tmp_path}"])
    assert [r.image_id for r in load_split(config.data, "val")] == [1002]
    with pytest.raises(DatasetError, match="no images in split"):
        load_karpathy(_write(tmp_path / "empty.json", {"images": []}), tmp_path, "test")


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_malformed_annotation_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="caption annotation file not found"):
        load_coco_captions(tmp_path / "nope.json", tmp_path)
    (tmp_path / "broken.json").write_text('{"images": [')
    with pytest.raises(DatasetError, match="broken.json: not valid JSON"):
        load_coco_captions(tmp_path / "broken.json", tmp_path)
    _write(tmp_path / "noimages.json", {"annotations": []})
    with pytest.raises(DatasetError, match="noimages.json: not a COCO caption file"):
        load_coco_captions(tmp_path / "noimages.json", tmp_path)
    _write(tmp_path / "nocaption.json",
           {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [{"id": 1, "image_id": 1}]})
    with pytest.raises(DatasetError, match=r"nocaption.json: annotations\[0\] has no 'caption'"):
        load_coco_captions(tmp_path / "nocaption.json", tmp_path)
    with pytest.raises(DatasetError, match="not a Karpathy split file"):
        load_karpathy(_write(tmp_path / "k.json", [1, 2]), tmp_path, "train")


def flickr_fixture(root: Path) -> None:
    names = [f"{i}_photo.jpg" for i in range(6)]
    lines = [f"{n}#{k}\tA caption {k} of {n} ." for n in names for k in range(5)]
    (root / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    (root / "Flickr_8k.trainImages.txt").write_text("\n".join(names[:4]) + "\n")
    (root / "Flickr_8k.devImages.txt").write_text(names[4] + "\n")
    (root / "Flickr_8k.testImages.txt").write_text(names[5] + "\n")
    write_images(root / "images", names[:3] + names[4:])  # 3_photo.jpg is missing


def test_flickr8k_missing_images(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    flickr_fixture(tmp_path)
    with caplog.at_level(logging.WARNING):
        train = load_flickr8k(tmp_path, "train")
    assert [r.path.name for r in train] == ["0_photo.jpg", "1_photo.jpg", "2_photo.jpg"]
    assert [r.image_id for r in train] == [0, 1, 2]
    assert len(train[0].captions) == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 of 4 images are missing" in warnings[0]
    with pytest.raises(DatasetError, match="1 of 4 images are missing.*strict"):
        load_flickr8k(tmp_path, "train", strict=True)
    assert [r.image_id for r in load_flickr8k(tmp_path, "val")] == [4]


def test_flickr8k_malformed_token_file(tmp_path: Path) -> None:
    flickr_fixture(tmp_path)
    (tmp_path / "Flickr8k.token.txt").write_text("0_photo.jpg#0\tok caption\nthis line has no tab\n")
    with pytest.raises(DatasetError, match=r"Flickr8k.token.txt:2: expected"):
        load_flickr8k(tmp_path, "train")


def test_real_flickr8k(shared_data: Path) -> None:
    """The shared folder's 1,000 full-resolution photos: a deliberate subset of the official lists."""
    subset = ["data.dataset=flickr8k", f"data.root={shared_data / 'flickr8k'}"]
    with pytest.raises(DatasetError, match=(r"Flickr_8k.trainImages.txt: 5247 of 6000 images are missing on disk "
                                            r".*more than data.max_missing_fraction")):
        load_split(load_config(None, subset).data, "train")  # by default a partial copy stops the load
    config = load_config(None, [*subset, "data.max_missing_fraction=1"])
    sizes = {split: len(load_split(config.data, split)) for split in ("train", "val", "test")}
    assert sizes == {"train": 753, "val": 113, "test": 125}
    vocab = Vocabulary.build(c for r in load_split(config.data, "train") for c in r.captions)
    for split in ("train", "val", "test"):
        records = load_split(config.data, split)
        dataset = CaptionDataset(records[:8], vocab, ImageTransform(64), 20, pairs="all")
        batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=collate_captions)))
        assert batch.images.shape == (4, 3, 64, 64) and batch.tokens.shape[0] == 20  # 5 captions each
        assert (batch.tokens[:, 0] == vocab.bos_id).all()


def test_bad_file_does_not_kill_workers(tmp_path: Path) -> None:
    flickr_fixture(tmp_path)
    records = load_flickr8k(tmp_path, "train")
    (records[1].path).write_bytes(b"corrupted after the listing")
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    dataset = CaptionDataset(records, vocab, ImageTransform(32), 20, pairs="one")
    loader = DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=collate_captions)
    batches = [b for b in loader]
    seen = torch.cat([b.indices for b in batches if b is not None]).tolist()
    assert sorted(seen) == [0, 2]  # the corrupt image is skipped, the rest arrive
    assert all(b.tokens.shape[0] == b.images.shape[0] for b in batches if b is not None)


def test_collate_all_pairs(tmp_path: Path) -> None:
    flickr_fixture(tmp_path)
    records = load_flickr8k(tmp_path, "train")
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    dataset = CaptionDataset(records, vocab, ImageTransform(32), 20, pairs="all")
    batch = collate_captions([dataset[0], None, dataset[2]])
    assert batch.images.shape == (2, 3, 32, 32)
    assert batch.tokens.shape[0] == 10 and batch.image_rows.tolist() == [0] * 5 + [1] * 5
    assert (batch.lengths == (batch.tokens != vocab.pad_id).sum(dim=1)).all()
    assert (batch.tokens[torch.arange(10), batch.lengths - 1] == vocab.eos_id).all()
    assert batch.indices.tolist() == [0, 2]
    assert collate_captions([None]) is None


def test_stats_on_coco_val2014(shared_data: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "stats", "--coco", str(shared_data / "coco" / "captions_val2014.json"), "--min-count", "5",
                 "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["images"] == 40504 and stats["captions"] == 202654
    assert 5000 < stats["vocabulary (min count 5)"] < 8000


def test_stats_count_the_words_the_vocabulary_keeps() -> None:
    from captioner.data.records import ImageRecord
    from captioner.data.datasets import dataset_stats

    captions = [("A dog runs.", "The dog is running!"), ("A cat, a mat.", "Two dogs; one cat")]
    records = [ImageRecord(i, Path(f"{i}.jpg"), c) for i, c in enumerate(captions)]
    stats = dataset_stats(records, min_count=2)
    every = [c for pair in captions for c in pair]
    assert stats["words (all)"] == len(Vocabulary.build(every, 1)) - 4 == 11  # punctuation is not a word
    assert stats["vocabulary (min count 2)"] == len(Vocabulary.build(every, 2)) - 4 == 3  # a, dog, cat
    assert stats["captions"] == 4 and stats["caption length max"] == 4


def test_stats_on_flickr8k(shared_data: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "stats", "--flickr8k", str(shared_data / "flickr8k")]) == 0
    out = capsys.readouterr().out
    assert "images on disk" in out and "991" in out  # the 1,000 images less the 9 in no split
