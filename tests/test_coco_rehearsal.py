"""The COCO rehearsal: the shipped COCO configs, through the `captioner` command as a user runs it,
on a miniature COCO tree of real photographs (tests/coco_tree.py).

Only sizes are overridden (decoder widths, 64 px images, 1 epoch, no loader workers). ResNet-101
is the configs' own encoder; its ImageNet weights cannot be downloaded here, so random stand-ins
are written where torchvision keeps the downloaded file ($TORCH_HOME/hub/checkpoints), and
`pretrained: true` takes the same path it takes on a machine that fetched them once.

Both stages and both routes: cross-entropy on images (fine-tuning layer3 and layer4, augmented)
and from the fp16 feature store (frozen encoder), SCST from each best.pt with the SCST config as
shipped, `evaluate --split test --beam 3`, `caption`, the demo page, and torchrun with 2 ranks.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from coco_tree import CocoTree, build_coco_tree
from helpers import subprocess_env
import warm_start

from captioner.core.config_sections import DataConfig
from captioner.core.errors import DatasetError
from captioner.data.coco import load_karpathy
from captioner.data.datasets import load_split
from captioner.models.checkpoint import load_captioner

ROOT = Path(__file__).resolve().parents[1]
LSTM, TRANSFORMER = ROOT / "configs/coco_lstm_resnet101.yaml", ROOT / "configs/coco_transformer_resnet101.yaml"
LSTM_SCST, TRANSFORMER_SCST = (ROOT / f"configs/{c.stem}_scst.yaml" for c in (LSTM, TRANSFORMER))
SIZES = [  # the only departures from the shipped configs: sizes
    "data.image_size=64",
    "data.batch_size=8",
    "data.num_workers=0",
    "model.decoder.embed_dim=16",
    "model.decoder.hidden_dim=24",
    "model.decoder.attention_dim=12",
    "model.decoder.d_model=16",
    "model.decoder.num_heads=2",
    "model.decoder.num_layers=1",
    "model.decoder.ff_dim=32",
    "train.epochs=1",
    "train.device=cpu",
    "decode.max_length=8",
    "scst.max_length=8",
]
STORE = ["model.encoder.fine_tune_blocks=0", "data.augment=false"]  # the frozen-encoder route
# One pytest worker for the module: its trained checkpoints (module fixtures) are made once, not once a worker.
pytestmark = pytest.mark.xdist_group("coco_rehearsal")


@dataclass
class Rehearsal:
    tree: CocoTree
    runs: Path
    env: dict[str, str]
    weights: Path  # the stand-in ImageNet weights

    def data(self) -> list[str]:
        """Where this tree is (the configs say data/coco)."""
        return [f"data.karpathy_file={self.tree.karpathy_file}", f"data.image_root={self.tree.root}"]

    def captioner(self, *args: str, expect: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        result = warm_start.run([sys.executable, "-m", "captioner", *args], cwd=ROOT, env=env or self.env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == expect, result.stderr[-3000:]
        return result

    def train(self, config: Path, out: str, *overrides: str, init: Path | None = None) -> subprocess.CompletedProcess:
        init_args = ["--init", str(init)] if init else []
        return self.captioner("train", str(config), *SIZES, *self.data(), f"train.out_dir={self.runs / out}",
                              *overrides, *init_args)


def stand_in_weights(torch_home: Path, seed: int = 0) -> Path:
    """Random ResNet-101 weights under the name torchvision gives the downloaded ImageNet file."""
    import torchvision

    url = torchvision.models.get_model_weights("resnet101").DEFAULT.url
    path = torch_home / "hub" / "checkpoints" / url.rsplit("/", 1)[-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(torchvision.models.resnet101().state_dict(), path)
    return path


@pytest.fixture(scope="module")
def tree(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> CocoTree:
    return build_coco_tree(shared_data / "flickr8k", tmp_path_factory.mktemp("coco_tree") / "coco")


@pytest.fixture(scope="module")
def rehearsal(tree: CocoTree, tmp_path_factory: pytest.TempPathFactory) -> Rehearsal:
    root = tmp_path_factory.mktemp("coco_rehearsal")
    weights = stand_in_weights(root / "torch")
    env = subprocess_env(TORCH_HOME=str(root / "torch"))
    return Rehearsal(tree, root / "runs", env, weights)


# --- the tree and its Karpathy file ------------------------------------------------------------


def test_tree_has_the_layout_of_a_coco_download(tree: CocoTree) -> None:
    root = tree.root
    assert sorted(p.name for p in root.iterdir()) == ["annotations", "dataset_coco.json", "train2014", "val2014"]
    assert sorted(p.name for p in (root / "annotations").iterdir()) == ["captions_train2014.json",
                                                                        "captions_val2014.json"]
    train_files = sorted(p.name for p in (root / "train2014").iterdir())
    assert len(train_files) == 16 and all(n.startswith("COCO_train2014_") and len(n)
                                          == len("COCO_train2014_000000100000.jpg") for n in train_files)
    assert len(list((root / "val2014").iterdir())) == 4 + 6 + 6  # restval, val and test come from val2014
    entries = json.loads(tree.karpathy_file.read_text())["images"]
    assert {e["split"] for e in entries} == {"train", "restval", "val", "test"}
    assert all(len(e["sentences"]) == 5 and e["sentences"][0]["tokens"] for e in entries)
    # the official caption files load too (dataset: coco, without Karpathy's splits)
    coco = DataConfig(dataset="coco", root=str(root))
    assert [len(load_split(coco, split)) for split in ("train", "val", "test")] == [16, 8, 8]


def test_karpathy_split_sizes_are_logged_and_departures_from_coco_warned(
    tree: CocoTree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from captioner.data import coco

    # logged once per process: an earlier test may have read this tree's file
    monkeypatch.setattr(coco, "_reported", set())
    with caplog.at_level(logging.INFO, logger="captioner.data.coco"):
        train = load_karpathy(tree.karpathy_file, tree.root, "train")
    assert len(train) == 16 + 4  # restval joins train
    [info] = [r for r in caplog.records if r.levelno == logging.INFO]
    assert info.getMessage() == f"{tree.karpathy_file}: train 20 (16 train + 4 restval), val 6, test 6 images"
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"{tree.karpathy_file}: split sizes train 20 / val 6 / test 6 differ from Karpathy's COCO split "
        "(113287 / 5000 / 5000): a partial or modified file?"
    )


def test_a_standard_karpathy_file_is_not_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sentences = [{"raw": "a cat", "tokens": ["a", "cat"]}]
    sizes = {"train": 82783, "restval": 30504, "val": 5000, "test": 5000}
    images = [{"filepath": "val2014", "filename": f"{i}.jpg", "cocoid": i, "split": split, "sentences": sentences}
              for i, split in enumerate(s for s, n in sizes.items() for _ in range(n))]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    with caplog.at_level(logging.INFO, logger="captioner.data.coco"):
        assert len(load_karpathy(path, tmp_path, "test", check_images=False)) == 5000
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: train 113287 (82783 train + 30504 restval), val 5000, test 5000 images"]
    caplog.clear()  # a Flickr file (no cocoid) has its own sizes: logged, never compared with COCO's
    flickr = tmp_path / "dataset_flickr8k.json"
    flickr.write_text(json.dumps({
        "dataset": "flickr8k", "images": [{"filename": "a.jpg", "imgid": 0, "split": "test", "sentences": sentences}]}))
    with caplog.at_level(logging.INFO, logger="captioner.data.coco"):
        load_karpathy(flickr, tmp_path, "test", check_images=False)
    assert [r.getMessage()
            for r in caplog.records] == [f"{flickr}: train 0 (0 train + 0 restval), val 0, test 1 images"]


def test_missing_images_are_counted_in_one_line_or_stop_a_strict_load(tree: CocoTree, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A partial download: one test image of six is not on disk."""
    shutil.copytree(tree.root / "val2014", tmp_path / "val2014")
    missing = tmp_path / "val2014" / tree.test_images[2].name
    missing.unlink()
    with caplog.at_level(logging.WARNING, logger="captioner.data.records"):
        assert len(load_karpathy(tree.karpathy_file, tmp_path, "test")) == 5
    # The records' line; the split-size warning is the coco loader's, once per process (which test
    # meets it first depends on the order, one pytest worker or several).
    missing_lines = [r.getMessage() for r in caplog.records if r.name == "captioner.data.records"]
    assert missing_lines == [f"{tree.karpathy_file}: 1 of 6 images are missing on disk (e.g. {missing}); skipping them"]
    with pytest.raises(DatasetError, match="^" + re.escape(
        f"{tree.karpathy_file}: 1 of 6 images are missing on disk (e.g. {missing}); strict mode is on") + "$"):
        load_karpathy(tree.karpathy_file, tmp_path, "test", strict=True)


# --- both stages, both routes ------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_trained(rehearsal: Rehearsal) -> Path:
    """The LSTM config as shipped: layer3 and layer4 fine-tune on augmented images."""
    result = rehearsal.train(LSTM, "lstm")
    assert "train 20 (16 train + 4 restval), val 6, test 6 images" in result.stderr
    assert "differ from Karpathy's COCO split" in result.stderr
    assert "feature store" not in result.stderr
    return rehearsal.runs / "lstm" / "best.pt"


@pytest.fixture(scope="module")
def store_trained(rehearsal: Rehearsal) -> Path:
    """The transformer config on the frozen encoder's feature store, extracted first by `captioner features`."""
    store = rehearsal.runs / "store"
    result = rehearsal.captioner("features", str(TRANSFORMER), *SIZES, *rehearsal.data(), *STORE, "--out", str(store),
                                 "--splits", "train,val")
    assert result.stdout.splitlines()[0].startswith("train: 20 images (0 failed to load) x 14x14 x 2048 fp16, ")
    extracted = (store / "train.npy").stat().st_mtime_ns
    result = rehearsal.train(TRANSFORMER, "transformer_store", *STORE, f"data.feature_store={store}")
    assert f"training the decoder on the feature store in {store}" in result.stderr
    assert (store / "train.npy").stat().st_mtime_ns == extracted  # read, not rebuilt
    return rehearsal.runs / "transformer_store" / "best.pt"


@pytest.mark.slow
def test_cross_entropy_on_images_fine_tunes_the_top_blocks(rehearsal: Rehearsal, image_trained: Path) -> None:
    state = torch.load(image_trained, weights_only=True)
    stand_in = torch.load(rehearsal.weights, weights_only=True)
    changed = {name.split(".")[0] for name, w in stand_in.items()
               if w.is_floating_point() and not name.startswith("fc.")
               and not torch.equal(state["model"][f"encoder.blocks.{_block(name)}"], w)}
    assert changed == {"layer3", "layer4"}, changed


def _block(name: str) -> str:
    """A torchvision ResNet parameter's name inside the captioner's encoder blocks (stem, layer1..4)."""
    stem = {"conv1": "0.0", "bn1": "0.1"}
    first, rest = name.split(".", 1)
    if first in stem:
        return f"{stem[first]}.{rest}"
    return f"{int(first[-1])}.{rest}"


@pytest.mark.slow
def test_scst_from_the_image_trained_checkpoint(rehearsal: Rehearsal, image_trained: Path) -> None:
    rehearsal.train(LSTM_SCST, "lstm_scst", init=image_trained)
    history = (rehearsal.runs / "lstm_scst" / "metrics.csv").read_text().splitlines()
    assert len(history) == 3 and "train_reward" in history[0]  # header, the starting model, epoch 1
    caption = load_captioner(rehearsal.runs / "lstm_scst" / "best.pt").caption(rehearsal.tree.test_images[0],
                                                                               beam_size=3)
    first_stage = torch.load(image_trained, weights_only=True, mmap=True)["vocab"]  # its words, not its 500 MB
    assert set(caption.words) <= set(first_stage)  # the first stage's vocabulary


@pytest.mark.slow
def test_scst_from_the_store_trained_checkpoint_needs_no_store_overrides(rehearsal: Rehearsal,
                                                                         store_trained: Path) -> None:
    """The issue's suspicion, confirmed and fixed: the SCST config as shipped (fine_tune_blocks 2,
    augment on) refused a checkpoint trained with fine_tune_blocks 0 on the store."""
    result = rehearsal.train(TRANSFORMER_SCST, "transformer_scst", init=store_trained)
    assert "model.encoder.fine_tune_blocks is 0 in the checkpoint, 2 here" in result.stderr
    model = load_captioner(rehearsal.runs / "transformer_scst" / "best.pt")
    assert model.config.encoder.fine_tune_blocks == 2  # this stage fine-tunes, as its config says


@pytest.mark.slow
def test_evaluate_caption_and_demo_load_the_checkpoint(rehearsal: Rehearsal, image_trained: Path, java: str,
                                                       tmp_path: Path) -> None:
    result = rehearsal.captioner("evaluate", str(image_trained), "--split", "test", "--beam", "3", "--json", "--out",
                                 str(tmp_path))
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["images"] == 6 and {"Bleu_4", "CIDEr", "METEOR", "ROUGE_L"} <= report["scores"].keys()
    results = json.loads((tmp_path / "results_test.json").read_text())
    assert sorted(r["image_id"] for r in results) == sorted(int(p.stem.rsplit("_", 1)[1])
                                                            for p in rehearsal.tree.test_images)

    images = rehearsal.tree.test_images[:2]
    result = rehearsal.captioner("caption", str(image_trained), *map(str, images), "--beam", "3", "--json")
    rows = json.loads(result.stdout)
    assert [r["image"] for r in rows] == [str(p) for p in images]

    from helpers import require_module

    require_module("gradio", "the demo extra is not installed")
    from captioner.apps.demo import build_demo, caption_page, close, dataset_examples
    from captioner.models.checkpoint import checkpoint_config

    model = load_captioner(image_trained)
    # the demo's examples: COCO test images
    assert dataset_examples(checkpoint_config(image_trained)) == rehearsal.tree.test_images[:4]
    page = caption_page(model, "coco", images[0], beam_size=3, max_length=8, figure_dir=tmp_path)
    assert page.text == rows[0]["caption"] and len(page.gallery) == len(page.text.split())
    close(build_demo([image_trained]))


@pytest.mark.slow
def test_evaluate_a_store_trained_checkpoint_on_the_store(rehearsal: Rehearsal, store_trained: Path,
                                                          tmp_path: Path) -> None:
    """--features: the test split is encoded into the store once, then decoded from it."""
    store = rehearsal.runs / "store"
    result = rehearsal.captioner("evaluate", str(store_trained), "--split", "test", "--beam", "3", "--features",
                                 str(store), "--fast",
                                 "--json", "--out", str(tmp_path))
    assert json.loads(result.stdout[result.stdout.index("{"):])["images"] == 6
    assert (store / "test.npy").is_file() and len(json.loads((tmp_path / "results_test.json").read_text())) == 6


@pytest.mark.slow
def test_store_from_another_encoder_is_refused_in_one_line(rehearsal: Rehearsal, store_trained: Path,
                                                           tmp_path: Path) -> None:
    torch_home = tmp_path / "torch"
    stand_in_weights(torch_home, seed=1)  # other ImageNet weights than the store was built with
    store = rehearsal.runs / "store"
    result = rehearsal.captioner("train", str(TRANSFORMER), *SIZES, *rehearsal.data(), *STORE,
                                 f"data.feature_store={store}",
                                 f"train.out_dir={tmp_path / 'run'}", expect=2,
                                 env={**rehearsal.env, "TORCH_HOME": str(torch_home)})
    [line] = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert line.startswith(f"error: {store / 'train.json'}: encoder.fingerprint is ") and "delete" in line


@pytest.mark.slow
def test_the_store_route_under_torchrun_with_two_ranks(rehearsal: Rehearsal, store_trained: Path,
                                                       tmp_path: Path) -> None:
    """Two gloo ranks on the single run's store (checked, not rebuilt), then SCST from their best.pt."""
    store = rehearsal.runs / "store"
    common = [*SIZES, *rehearsal.data(), *STORE, f"data.feature_store={store}", "data.batch_size=4"]
    # -v: the batch and learning-rate line is a diagnostic
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              *warm_start.TORCHRUN_CAPTIONER, "train", "-v"]
    xe = warm_start.run([*launch, str(TRANSFORMER), *common, f"train.out_dir={tmp_path / 'xe'}"],
                        cwd=ROOT, env=rehearsal.env, capture_output=True, text=True, timeout=600)
    assert xe.returncode == 0, xe.stderr[-3000:]
    # 20 train images: 2 whole global batches of 2 x 4 an epoch, so the configured 1.13 warmup epochs are 2 steps
    assert ("2 processes x batch 4 = global batch 8; 2 steps per epoch; lr 0.0003, encoder_lr 0.0001 as configured "
            "(train.lr_scaling none); warmup 2 steps = 1 epochs, then cosine") in xe.stderr
    scst = warm_start.run([*launch, str(TRANSFORMER_SCST), *common, f"train.out_dir={tmp_path / 'scst'}",
                           "train.lr_scaling=linear",
                           "--init", str(tmp_path / "xe" / "best.pt")], cwd=ROOT, env=rehearsal.env,
                           capture_output=True, text=True, timeout=600)
    assert scst.returncode == 0, scst.stderr[-3000:]
    assert "lr 5e-05, encoder_lr 1e-05 x 0.25 (linear scaling: global batch 8 / base batch 32)" in scst.stderr
    rows = (tmp_path / "scst" / "metrics.csv").read_text().splitlines()
    # constant schedule
    assert float(rows[-1].split(",")[rows[0].split(",").index("lr")]) == pytest.approx(5e-5 * 8 / 32)
    assert load_captioner(tmp_path / "scst" / "best.pt").caption(rehearsal.tree.test_images[0]).words is not None


def test_init_lets_a_stage_change_only_how_the_encoder_trains(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """fine_tune_blocks is the stage's own choice (logged); anything that shapes the model still
    has to match the checkpoint."""
    from helpers import tiny_config, tiny_model

    from captioner.core.errors import CheckpointError
    from captioner.models.checkpoint import save_checkpoint
    from captioner.training.state import read_init_checkpoint

    path = tmp_path / "xe.pt"
    save_checkpoint(path, tiny_model("model.encoder.fine_tune_blocks=0"),
                    optimizer={"state": {0: {"exp_avg": torch.ones(8)}}, "param_groups": []})
    with caplog.at_level(logging.INFO, logger="captioner.training.state"):
        initial = read_init_checkpoint(tiny_config(f"train.init={path}", "model.encoder.fine_tune_blocks=2"))
    assert "optimizer" not in initial  # a stage starts its own: the last one's moments are not read
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: model.encoder.fine_tune_blocks is 0 in the checkpoint, 2 here: this stage trains as its config says"
    ]
    with pytest.raises(
            CheckpointError,
            match=r"model.decoder.hidden_dim is 24 in the checkpoint but 32 in the config; train.init needs"):
        read_init_checkpoint(
            tiny_config(f"train.init={path}", "model.encoder.fine_tune_blocks=2", "model.decoder.hidden_dim=32"))
