"""The input pipeline: uint8 images to the device, normalised in the encoder bit-identically to
the old float pipeline; the feature store's manifest describing the real transform; DataLoader
workers and torch threads from the cores, the ranks and torchrun's settings."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.io
from helpers import TINY_MODEL, tiny_model, tiny_vocab
from PIL import Image
from torchvision.io import decode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from captioner.core import process_settings
from captioner.core.config import load_config
from captioner.core.config_sections import MAX_THREADS
from captioner.core.errors import ConfigError, FeatureStoreError, ImageLoadError
from captioner.data import batching
from captioner.data.batching import (
    EXIF_ORIENTATION,
    CaptionDataset,
    EncodedJpeg,
    collate_captions,
    decode_jpegs,
    device_preprocess,
    image_loader,
    read_for_device,
    transform_on_device,
)
from captioner.data.image_files import load_image
from captioner.data.image_transform import (
    IMAGENET,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageTransform,
    PixelNormalization,
    normalize_images,
    picture_tensor,
)
from captioner.data.records import ImageRecord
from captioner.data.shapes import generate_shapes
from captioner.data.store_format import check_manifest, identity
from captioner.models.encoders import NORMALIZATIONS
from captioner.models.captioner import Captioner
from captioner.training import run_setup
from captioner.training.fit import fit

REPO = Path(__file__).resolve().parents[1]

SIZE = 32


def photos(shared_data: Path, count: int) -> list[Path]:
    return sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:count]


def old_float_pipeline(size: int) -> v2.Compose:
    """The evaluation transform as it was before images crossed to the device as uint8 (with
    Pillow's resize, as today)."""
    return v2.Compose([
        v2.Resize((size, size), antialias=True), v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def test_uint8_images_encode_bit_identically_to_the_old_float_pipeline(shared_data: Path) -> None:
    model = tiny_model()
    paths = photos(shared_data, 3)
    pictures = [load_image(p) for p in paths]
    old = torch.stack([old_float_pipeline(SIZE)(p) for p in pictures])  # (3, 3, S, S) float32
    new = torch.stack([model.transform(p) for p in pictures])  # (3, 3, S, S) uint8
    assert new.dtype == torch.uint8 and new.nbytes * 4 == old.nbytes  # a quarter of the bytes cross to the device
    assert torch.equal(normalize_images(new), old)
    with torch.no_grad():
        old_feats, grid = model.encode(old)  # float input: taken as already normalised
        new_feats, new_grid = model.encode(new)
    assert grid == new_grid and torch.equal(new_feats, old_feats)
    # The training path: a collated batch crosses to the device as uint8 (channels-last as training asks).
    record = ImageRecord(0, paths[0], ("a red circle",))
    batch = collate_captions([CaptionDataset([record], tiny_vocab(), model.transform, 10)[0]])
    moved = batch.to(torch.device("cpu"), channels_last=True)
    assert moved.images.dtype == torch.uint8
    with torch.no_grad():
        # batch sizes alike: oneDNN blocks by batch
        assert torch.equal(model.encode(moved.images)[0], model.encode(old[:1])[0])
    # Captioning from files gives the captions the float images give.
    assert [c.text for c in model.caption(paths)] == [c.text for c in model.caption(old)]


@pytest.mark.parametrize("size", [32, 224, 260])
def test_the_resize_is_pillows_own(size: int, shared_data: Path) -> None:
    """The evaluation transform's bytes are Pillow's bilinear resize, which a runtime without torch
    (captioner.deploy) reproduces with Pillow alone; torchvision's tensor resize would differ."""
    for path in photos(shared_data, 3):
        picture = load_image(path)
        pillow = np.asarray(picture.resize((size, size), Image.BILINEAR)).transpose(2, 0, 1)  # (3, S, S)
        assert np.array_equal(ImageTransform(size)(picture).numpy(), pillow)
    tensor_resized = v2.Resize((224, 224), antialias=True)(v2.PILToTensor()(picture)).numpy()
    assert not np.array_equal(tensor_resized, np.asarray(picture.resize((224, 224), Image.BILINEAR)).transpose(2, 0, 1))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_pictures_transform_is_the_torchvision_pipelines_to_the_byte(mode: str, shared_data: Path) -> None:
    """The evaluation transform resizes a picture with Pillow alone (torchvision stays unloaded for a
    caption); it makes what its described torchvision steps make: the same bytes, shape and strides,
    for a picture already at the size as well."""
    picture = load_image(photos(shared_data, 1)[0]).convert(mode)
    for size in (32, 224, picture.width):
        transform = ImageTransform(size)
        square = picture.resize((size, size)) if size == picture.width else picture
        fast, described = transform(square), transform.pipeline()(square)  # uint8 (C, S, S) each
        assert fast.dtype == described.dtype == torch.uint8 and torch.equal(fast, described)
        assert fast.shape == described.shape == (len(mode), size, size) and fast.stride() == described.stride()
    whole, described = picture_tensor(picture), v2.PILToTensor()(picture)  # uint8 (C, H, W): the loaders' tensor
    assert torch.equal(whole, described) and whole.stride() == described.stride()


def test_normalize_refuses_float_images() -> None:
    with pytest.raises(TypeError, match="expected uint8 images, got torch.float32"):
        normalize_images(torch.zeros(1, 3, 4, 4))


@pytest.mark.parametrize("name", list(NORMALIZATIONS))
def test_the_described_normalisation_is_the_one_that_runs(name: str, shared_data: Path) -> None:
    """Each registered set of statistics: the encoder's `PixelNormalization` computes, to the bit,
    what the torchvision steps its description names compute, on real photos."""
    images = torch.stack([ImageTransform(SIZE)(load_image(p)) for p in photos(shared_data, 2)])  # (2, 3, S, S) uint8
    normalization = PixelNormalization(NORMALIZATIONS[name])
    described = normalization.describe()
    steps = v2.Compose([v2.ToDtype(torch.float32, scale=True),
                        v2.Normalize(list(NORMALIZATIONS[name].mean), list(NORMALIZATIONS[name].std))])
    assert described == [repr(step) for step in steps.transforms]
    assert torch.equal(normalization(images), steps(images))


def identify(model: Captioner) -> dict:
    return identity(model.encoder, model.transform)


def test_store_identity_describes_the_real_transform(tmp_path: Path) -> None:
    model = tiny_model()
    described = identify(model)["transform"]
    assert described == [*ImageTransform(SIZE).describe(), *IMAGENET.describe()]
    assert described == [*[repr(step) for step in model.transform.pipeline().transforms],
                         *model.encoder.normalize.describe()]
    assert any("Resize(size=[32, 32]" in step for step in described) and any("Normalize(mean=[0.485" in step
                                                                             for step in described)
    assert identity(model.encoder, ImageTransform(48))["transform"] != described
    # Other statistics (another backbone's, or a config's) are another pipeline: a store made with them is stale.
    other_statistics = tiny_model("model.encoder.normalization=tf_lite")
    assert (identify(other_statistics)["transform"][:2] == described[:2] and identify(other_statistics)["transform"]
            != described)
    # A store written by the old code described its pipeline by hand: torchvision's tensor resize,
    # which rounds a few pixels apart from Pillow's; it is stale, and refused naming both.
    legacy = {**identify(model), "transform": {"resize": "square", "antialias": True, "mean": list(IMAGENET_MEAN),
                                               "std": list(IMAGENET_STD)}}
    manifest = {"identity": legacy, "image_ids": [], "split": "train", "paths": []}
    with pytest.raises(FeatureStoreError, match=(r"train\.json: transform is \['PILToTensor\(\)', 'Resize.* in the "
                                                 r"store but \['Resize.*'PILToTensor\(\)'")) as error:
        check_manifest(tmp_path / "train.json", manifest, identify(model), [])
    assert "\n" not in str(error.value)
    check_manifest(tmp_path / "train.json", {**manifest, "identity": identify(model)}, identify(model), [])
    # A store written before the transform and the normalisation were described apart: stale too.
    before = ["PILToTensor()", "Resize(size=[32, 32], interpolation=bilinear, antialias=True)", "ToDtype(scale=True)",
              "Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], inplace=False)"]
    with pytest.raises(FeatureStoreError, match="transform is"):
        check_manifest(tmp_path / "train.json", {**manifest, "identity": {**legacy, "transform": before}},
                       identify(model), [])


# --- workers and threads ----------------------------------------------------------------------------


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch):
    """A node with `cores` usable cores and a clean environment of thread and rank settings."""
    for name in ("LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", process_settings.ENV_THREADS):
        monkeypatch.delenv(name, raising=False)

    def make(cores: int, **env: str) -> None:
        monkeypatch.setattr(process_settings, "usable_cores", lambda: cores)
        monkeypatch.setattr(process_settings, "free_cores", lambda: cores)
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return make


@pytest.mark.parametrize(("cores", "ranks", "workers"),
                         [(16, 8, 1), (16, 4, 3), (16, 1, 15), (2, 8, 1), (2, 1, 1), (64, 8, 7)])
def test_auto_workers_share_the_cores_between_the_ranks(node, cores: int, ranks: int, workers: int) -> None:
    node(cores, LOCAL_WORLD_SIZE=str(ranks))
    assert process_settings.loader_workers(process_settings.AUTO_WORKERS) == workers
    # a number is taken as given
    assert process_settings.loader_workers(5) == 5 and process_settings.loader_workers(0) == 0


def test_image_loader_resolves_auto_workers(node) -> None:
    node(4, LOCAL_WORLD_SIZE="2")
    assert image_loader([], ImageTransform(SIZE), 4, process_settings.AUTO_WORKERS).num_workers == 1


def test_auto_workers_outside_torchrun(node) -> None:
    node(16)
    assert process_settings.loader_workers(process_settings.AUTO_WORKERS) == 15


def test_num_workers_config() -> None:
    assert load_config(None, ["data.num_workers=-1"]).data.num_workers == process_settings.AUTO_WORKERS
    with pytest.raises(ConfigError, match="data.num_workers") as error:
        load_config(None, ["data.num_workers=-2"])
    assert "\n" not in str(error.value)


def test_threads_honour_torchrun(node) -> None:
    node(16, LOCAL_WORLD_SIZE="8", OMP_NUM_THREADS="2")
    assert process_settings.resolve_threads() == 2  # torchrun's split of the node, not the 16 cores
    assert process_settings.resolve_threads(5) == 5  # train.threads wins
    node(16, LOCAL_WORLD_SIZE="8", OMP_NUM_THREADS="2", CAPTIONER_THREADS="3")
    assert process_settings.resolve_threads() == 3  # then $CAPTIONER_THREADS


def test_threads_under_torchrun_without_omp(node) -> None:
    node(16, LOCAL_WORLD_SIZE="4")
    assert process_settings.resolve_threads() == 4  # this rank's share of the cores


def test_threads_outside_torchrun_ignore_omp(node) -> None:
    node(6, OMP_NUM_THREADS="2")
    assert process_settings.resolve_threads() == 6  # the free cores, as before


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", process_settings.ENV_THREADS])
def test_bad_thread_settings_are_one_line_errors(node, name: str) -> None:
    node(4, **{"LOCAL_WORLD_SIZE": "2", name: "many"})
    with pytest.raises(ConfigError, match=rf"^{name}='many': expected a positive integer$"):
        process_settings.resolve_threads()


@pytest.mark.parametrize("value", ["-2", "0", "1.5", "1025", "99999999"])
def test_captioner_threads_is_bounded_as_train_threads_is(node, value: str) -> None:
    """$CAPTIONER_THREADS: a positive integer up to train.threads' largest (MAX_THREADS), else one line naming the
    variable, as a run's thread count (`run_threads`) and as any command's (`resolve_threads`)."""
    node(4, CAPTIONER_THREADS=value)
    said = "expected at most 1024 threads" if value.isdigit() and int(value) else "expected a positive integer"
    for threads in (process_settings.run_threads, process_settings.resolve_threads):
        with pytest.raises(ConfigError, match=rf"^CAPTIONER_THREADS='?{re.escape(value)}'?: {said}"):
            threads()
    node(4, CAPTIONER_THREADS=str(MAX_THREADS))
    assert process_settings.run_threads() == MAX_THREADS


@pytest.mark.parametrize("value", ["1025", "99999999"])
def test_torchrun_omp_num_threads_is_bounded_as_train_threads_is(node, value: str) -> None:
    """Under torchrun $OMP_NUM_THREADS is the thread count: bounded as train.threads and $CAPTIONER_THREADS are,
    in one line naming the variable, as a run's thread count and as any command's."""
    node(4, LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS=value)
    for threads in (process_settings.run_threads, process_settings.resolve_threads):
        with pytest.raises(ConfigError, match=rf"^OMP_NUM_THREADS={value}: expected at most 1024 threads "
                                              r"\(as train.threads\)$"):
            threads()
    node(4, LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS=str(MAX_THREADS))
    assert process_settings.run_threads() == MAX_THREADS


# --- JPEG decoding on the device (its CPU branch: torchvision's libjpeg) -----------------------------


def oriented_jpeg(path: Path, orientation: int) -> Path:
    """A 24x16 JPEG of three coloured quadrants, stored with an EXIF orientation tag."""
    picture = Image.new("RGB", (24, 16), (0, 0, 0))
    picture.paste((255, 0, 0), (0, 0, 12, 8))
    picture.paste((0, 255, 0), (12, 0, 24, 8))
    picture.paste((0, 0, 255), (12, 8, 24, 16))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    picture.save(path, quality=95, exif=exif.tobytes())
    return path


@pytest.mark.parametrize("orientation", range(1, 9))
def test_device_decoding_applies_exif_orientation_as_pil_does(tmp_path: Path, orientation: int) -> None:
    path = oriented_jpeg(tmp_path / "o.jpg", orientation)
    item = read_for_device(path)
    assert isinstance(item, EncodedJpeg) and item.orientation == orientation
    (decoded,) = decode_jpegs([item], "cpu")
    assert torch.equal(decoded, pil_to_tensor(load_image(path)))  # the same libjpeg-turbo: identical pixels


def test_device_path_gives_the_worker_path_images(shared_data: Path) -> None:
    """A dataset that leaves the transform (and the decoding) to the device gives, once its
    batch is on the device, the batch the worker path gives: the same augmentation from the
    same draws."""
    records = [ImageRecord(i, path, ("a red circle",)) for i, path in enumerate(photos(shared_data, 4))]
    transform = ImageTransform(SIZE, train=True, augment=True)
    keys = [(i, 100 + i) for i in range(4)]
    # (4, 3, S, S)
    expected = collate_captions([CaptionDataset(records, tiny_vocab(), transform, 10)[key] for key in keys]).images
    for preprocess, shipped in (("transform", torch.Tensor), ("decode", EncodedJpeg)):
        on_device = CaptionDataset(records, tiny_vocab(), transform, 10, device_preprocess=preprocess)
        pending = collate_captions([on_device[key] for key in keys])
        assert isinstance(pending.images, list) and all(isinstance(p.source, shipped) for p in pending.images)
        if preprocess == "decode":  # a file the worker decoded rides along with the JPEGs
            pending.images[1] = replace(pending.images[1], source=pil_to_tensor(load_image(records[1].path)))
        moved = pending.to(torch.device("cpu"), channels_last=True)
        assert moved.images.dtype == torch.uint8 and torch.equal(moved.images, expected)
        # and again: each item replays its seed
        assert torch.equal(transform_on_device(pending.images, "cpu"), expected)


def test_files_the_device_does_not_decode_go_through_pil(tmp_path: Path) -> None:
    picture = Image.new("RGB", (20, 10), (200, 30, 30))
    picture.save(tmp_path / "a.png")
    picture.convert("CMYK").save(tmp_path / "cmyk.jpg")
    for name in ("a.png", "cmyk.jpg"):
        item = read_for_device(tmp_path / name)
        assert isinstance(item, torch.Tensor) and torch.equal(item, pil_to_tensor(load_image(tmp_path / name)))


def test_device_decoding_keeps_load_image_checks(tmp_path: Path, shared_data: Path) -> None:
    photo = photos(shared_data, 1)[0]
    with pytest.raises(ImageLoadError, match=r"over the limit of 0 \(possible decompression bomb\)$"):
        read_for_device(photo, max_pixels=1000)
    (tmp_path / "page.pdf").write_bytes(b"%PDF-1.4 not an image")
    with pytest.raises(ImageLoadError, match=r"page\.pdf: not an image file"):
        read_for_device(tmp_path / "page.pdf")
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(photo.read_bytes()[:2000])  # a whole header, a few rows of the scan
    with pytest.raises(ImageLoadError,
                       match=r"^.*truncated\.jpg: corrupt or truncated image \(image file is truncated"):
        decode_jpegs([read_for_device(photo), read_for_device(truncated)], "cpu")  # the batch names the bad file


def test_a_jpeg_the_device_refuses_is_decoded_by_pil(tmp_path: Path, shared_data: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """nvjpeg refuses some valid JPEGs (PIL reads them): the batch falls back file by file."""
    paths = photos(shared_data, 2)
    items = [read_for_device(p) for p in paths]
    refused = items[1].data

    def device_decoder(data, **options):
        if any(d is refused for d in (data if isinstance(data, list) else [data])):
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return decode_jpeg(data, **options)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", device_decoder)  # batching imports it where it decodes
    decoded = decode_jpegs(items, "cpu")
    assert all(torch.equal(image, pil_to_tensor(load_image(p))) for image, p in zip(decoded, paths))


GPU_DECODING = """
import sys, torch
from captioner.data.batching import gpu_jpeg_decoding
assert not gpu_jpeg_decoding(torch.device("cpu")) and "torchvision" not in sys.modules, "torchvision loaded for a CPU"
cuda = gpu_jpeg_decoding(torch.device("cuda"))
import torchvision.io
print(cuda, hasattr(torch.ops.image, "decode_jpegs_cuda"))
"""


def test_whether_a_gpu_decodes_jpegs_is_asked_of_torchvision_loaded_then(tmp_path: Path) -> None:
    """In a fresh interpreter, where the loaders have not loaded torchvision: a CPU never decodes (and loads
    nothing to say so); for CUDA the answer is the one torchvision's nvjpeg ops give once loaded, not the empty
    op namespace of an unloaded torchvision, which would turn the GPU's decoding off without a word."""
    done = subprocess.run([sys.executable, "-c", GPU_DECODING], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    asked, loaded = done.stdout.split()
    assert asked == loaded


def test_progressive_jpegs_are_decoded_in_the_worker(tmp_path: Path) -> None:
    Image.new("RGB", (20, 10), (10, 200, 30)).save(tmp_path / "progressive.jpg", progressive=True)
    item = read_for_device(tmp_path / "progressive.jpg")
    assert isinstance(item, torch.Tensor) and item.shape == (3, 10, 20)


def test_training_with_device_preprocessing_gives_the_same_weights(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`fit` with data.device_preprocess, its device branch forced on the CPU (as on CUDA with
    nvjpeg): the workers ship decoded pictures or JPEG bytes through a DataLoader worker,
    `CaptionBatch.to` (decodes,) crops and jitters them under each item's seed, and the weights
    after an augmented epoch are those of the worker path, to the bit."""
    root = tmp_path / "shapes"
    generate_shapes(root, 16, 4, 2, image_size=32, seed=0, progress=False)  # JPEG files
    tiny = [
        *TINY_MODEL, "data.batch_size=4", "data.augment=true", "data.num_workers=1", "model.decoder.dropout=0.0",
        "train.epochs=1", "train.warmup_steps=2", "train.val_max_images=4", "train.early_stopping_patience=0",
        "train.device=cpu", "decode.max_length=6", f"data.root={root}",
    ]
    decoded_batches = []  # CaptionBatch.to runs in this process: count the batches it decoded
    monkeypatch.setattr(batching, "transform_on_device",
                        lambda *args: decoded_batches.append(1) or transform_on_device(*args))
    monkeypatch.setattr(run_setup, "device_preprocess", lambda requested, device: requested)
    weights = {}
    for preprocess in ("none", "transform", "decode"):
        out = tmp_path / preprocess
        fit(load_config(REPO / "configs/shapes_lstm.yaml",
                        [*tiny, f"data.device_preprocess={preprocess}", f"train.out_dir={out}"]))
        weights[preprocess] = torch.load(out / "last.pt", weights_only=True)["model"]
    assert len(decoded_batches) == 2 * 16 // 4  # every training batch of the device runs, none of the first
    for preprocess in ("transform", "decode"):
        assert weights[preprocess].keys() == weights["none"].keys()
        assert all(torch.equal(weights[preprocess][k], weights["none"][k]) for k in weights["none"]), preprocess


def test_device_preprocessing_only_on_cuda() -> None:
    assert device_preprocess("decode", torch.device("cpu")) == "none"
    assert device_preprocess("transform", torch.device("cpu")) == "none"
    assert load_config(None, []).data.device_preprocess == "none"
    with pytest.raises(ConfigError, match="data.device_preprocess"):
        load_config(None, ["data.device_preprocess=gpu"])
