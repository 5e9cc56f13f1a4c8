"""Fault: a damaged file. A checkpoint cut short or with a flipped bit, a feature array that is
truncated, altered or does not match its manifest: each is refused in one line naming the file,
before anything runs on it. (Damaged exports: tests/test_export.py.)"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.core.errors import CheckpointError, FeatureStoreError
from captioner.data.datasets import load_split
from captioner.data.store_extract import ensure_store, extract
from captioner.data.store_format import open_store
from captioner.models.checkpoint import save_checkpoint
from captioner.models import checkpoint_format
from captioner.models.checkpoint_format import FORMAT_VERSION, read_checkpoint
from test_feature_store import frozen_model, shapes_config


@pytest.fixture
def checkpoint_and_photo(tmp_path: Path) -> tuple[Path, Path]:
    torch.set_num_threads(1)
    checkpoint = tmp_path / "best.pt"
    save_checkpoint(checkpoint, tiny_model("decode.max_length=4"), step=3)
    photo = tmp_path / "photo.png"
    Image.fromarray(np.full((20, 24, 3), 90, dtype=np.uint8)).save(photo)
    return checkpoint, photo


def caption_refuses(path: Path, photo: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`captioner caption PATH PHOTO` exits 2 with one line naming PATH, and captions nothing."""
    code = main(["caption", str(path), str(photo), "--device", "cpu"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "", (code, out)
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("keep", [20000, 0.5, -1, -50, 10])
def test_a_truncated_checkpoint_is_refused_in_one_line(checkpoint_and_photo, tmp_path: Path, keep: float,
                                                       capsys) -> None:
    """`head -c 20000 best.pt > x.pt; captioner caption x.pt photo.jpg` (and other cuts: half,
    the last byte, inside the checksum, the first bytes)."""
    checkpoint, photo = checkpoint_and_photo
    data = checkpoint.read_bytes()
    cut = keep if isinstance(keep, int) and keep > 0 else len(data) + keep if isinstance(keep,
                                                                                         int) else int(len(data) * keep)
    truncated = tmp_path / "x.pt"
    truncated.write_bytes(data[:cut])
    line = caption_refuses(truncated, photo, capsys)
    assert "not a readable captioner checkpoint" in line


def flip_bit(path: Path, offset: int, out: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    out.write_bytes(bytes(data))
    return out


def test_a_flipped_bit_in_the_weights_is_refused_though_torch_would_load_it(checkpoint_and_photo, tmp_path: Path,
                                                                            capsys) -> None:
    checkpoint, photo = checkpoint_and_photo
    weights = torch.load(checkpoint, weights_only=True)["model"]
    name = max(weights, key=lambda k: weights[k].numel())  # the largest tensor: its storage is a zip record of its own
    needle = bytes(weights[name].untyped_storage())[:64]
    offset = checkpoint.read_bytes().index(needle) + 40
    flipped = flip_bit(checkpoint, offset, tmp_path / "flipped.pt")
    altered = torch.load(flipped, weights_only=True)["model"][name]  # torch itself notices nothing
    assert not torch.equal(altered, weights[name])
    line = caption_refuses(flipped, photo, capsys)
    assert "sha256 differs" in line


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_a_flipped_bit_anywhere_is_refused(checkpoint_and_photo, tmp_path: Path, where: float, capsys) -> None:
    checkpoint, photo = checkpoint_and_photo
    flipped = flip_bit(checkpoint, int(checkpoint.stat().st_size * where), tmp_path / "flipped.pt")
    caption_refuses(flipped, photo, capsys)
    with pytest.raises(CheckpointError, match="flipped.pt"):
        read_checkpoint(flipped)


def test_a_checkpoint_is_hashed_once_while_unchanged_and_again_once_changed(checkpoint_and_photo,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A command reads its checkpoint's run config, then its model: one sha256 of a settled file. A flipped bit
    written after that check is still refused, and a file written just now is hashed at every read (its time
    could not tell a change made within the file system's clock tick)."""
    checkpoint, _ = checkpoint_and_photo
    hashed: list[int] = []
    sha256 = checkpoint_format.hashlib.sha256
    monkeypatch.setattr(checkpoint_format.hashlib, "sha256", lambda: hashed.append(1) or sha256())
    read_checkpoint(checkpoint)
    read_checkpoint(checkpoint, for_inference=True)
    assert len(hashed) == 2  # written just now

    settled = checkpoint.stat().st_mtime - 60
    os.utime(checkpoint, (settled, settled))
    hashed.clear()
    read_checkpoint(checkpoint)
    read_checkpoint(checkpoint, for_inference=True)
    read_checkpoint(checkpoint)
    assert len(hashed) == 1

    weights = torch.load(checkpoint, weights_only=True)["model"]
    name = max(weights, key=lambda k: weights[k].numel())
    offset = checkpoint.read_bytes().index(bytes(weights[name].untyped_storage())[:64]) + 40
    with open(checkpoint, "r+b") as f:  # in place: the same file, the same size
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))
    with pytest.raises(CheckpointError, match="sha256 differs"):
        read_checkpoint(checkpoint, for_inference=True)


def test_a_checkpoint_from_before_checksums_loads_with_one_warning(checkpoint_and_photo, tmp_path: Path,
                                                                   caplog) -> None:
    checkpoint, _ = checkpoint_and_photo
    old = tmp_path / "old.pt"
    # plain torch.save: no checksum, as earlier versions wrote
    torch.save(torch.load(checkpoint, weights_only=True), old)
    with caplog.at_level(logging.WARNING):
        payload = read_checkpoint(old)
    assert payload["format_version"] == FORMAT_VERSION and payload["step"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "old.pt" in warnings[0] and "without a checksum" in warnings[0]


def test_another_torch_file_is_one_line_not_a_warning_about_old_checksums_too(tmp_path: Path, caplog) -> None:
    """A .pt of another program has no checksum either; it was warned of as a checkpoint from before checksums,
    then refused: two lines, the first wrong."""
    other = tmp_path / "other.pt"
    torch.save({"a": 1}, other)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError, match="not a captioner checkpoint"):
        read_checkpoint(other)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_checksummed_checkpoint_is_an_ordinary_torch_file(checkpoint_and_photo) -> None:
    checkpoint, _ = checkpoint_and_photo
    assert torch.load(checkpoint, weights_only=True)["step"] == 3
    assert read_checkpoint(checkpoint)["step"] == 3


# --- the feature store ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("corrupt_store")
    config = shapes_config(base / "shapes", base / "run")
    records = load_split(config.data, "val")
    model = frozen_model(config)
    store = extract(model.encoder, model.transform, base / "store", "val", records, batch_size=5, progress=False)
    return model, records, store


@pytest.fixture
def store_copy(store_setup, tmp_path: Path):
    model, records, store = store_setup
    folder = tmp_path / "store"
    shutil.copytree(store.array_path.parent, folder)
    return model, records, folder


def open_it(model, records, folder: Path):
    return open_store(folder, "val", model.encoder, model.transform, records)


def test_an_intact_store_opens(store_copy) -> None:
    model, records, folder = store_copy
    assert open_it(model, records, folder).complete


def test_a_truncated_feature_array_is_refused(store_copy) -> None:
    model, records, folder = store_copy
    array = folder / "val.npy"
    array.write_bytes(array.read_bytes()[:-1000])
    with pytest.raises(FeatureStoreError, match=r"val\.npy: \d+ bytes, \d+ expected \(truncated\)"):
        open_it(model, records, folder)
    # and training's path, which would rebuild a missing store
    with pytest.raises(FeatureStoreError, match="truncated"):
        ensure_store(model.encoder, model.transform, folder, "val", records, batch_size=5, progress=False)


def test_a_flipped_bit_in_the_feature_array_is_refused(store_copy) -> None:
    model, records, folder = store_copy
    array = folder / "val.npy"
    data = bytearray(array.read_bytes())
    data[len(data) - 3000] ^= 0x01  # a feature of the last chunk (rows 10-11)
    array.write_bytes(bytes(data))
    with pytest.raises(FeatureStoreError, match=r"val\.npy: rows 10-11 differ from the sha256 recorded"):
        open_it(model, records, folder)


def test_a_manifest_that_does_not_match_its_array_is_refused(store_copy) -> None:
    model, records, folder = store_copy
    np.save(folder / "val.npy", np.zeros((12, 4, 640), dtype=np.float16))  # another array under the same name
    with pytest.raises(FeatureStoreError,
                       match=r"val\.npy: holds float16 \(12, 4, 640\), but val\.json records float16 \(12, 4, 1280\)"):
        open_it(model, records, folder)


def test_a_store_from_before_checksums_opens_with_a_warning(store_copy, caplog) -> None:
    model, records, folder = store_copy
    manifest = json.loads((folder / "val.json").read_text())
    del manifest["checksums"]
    (folder / "val.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        assert open_it(model, records, folder).complete
    assert any("without checksums" in r.getMessage() for r in caplog.records)
