"""The golden captions: what today's models say, written to tests/data/golden/captions.json, so that
a refactor can show it changed nothing (tests/test_golden_captions.py decodes them again and
compares, byte for byte on the machine that wrote the file; tests/data/golden/README.md says what
the folder holds).

    python scripts/golden_captions.py             # rewrite captions.json from the committed models
    python scripts/golden_captions.py --models    # first train the two tiny shapes models again

Every decoding of DECODINGS, for the shapes models (both checkpoints and the export, and its ONNX
bundle when onnxruntime is installed) on the pictures and for the packaged model on the first
Flickr8k test photographs: tokens, text, scores as repr(float), attention maps by shape and
checksum; the committed files' checksums and state dict layouts; machine_key() as "made_on".
Decoded on one thread with the dense layers' products pinned to oneDNN's route where torch has it
(`pinned_arithmetic`). `--models` is not reproducible elsewhere; after it the "old format" files are
today's, which is the point only before a format change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from captioner.apps.arguments import AnyOrderParser

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
CAPTIONS = GOLDEN / "captions.json"
CHECKPOINTS = {"lstm": GOLDEN / "lstm.pt", "transformer": GOLDEN / "transformer.pt"}
EXPORT = GOLDEN / "export_lstm"
PICTURES = GOLDEN / "pictures"
PHOTO_COUNT = 4
PICTURE_COUNT = 6

# The decodings recorded, by name: DecodeOptions fields (n_best asks for each image's n best).
DECODINGS: dict[str, dict[str, Any]] = {
    "defaults": {},  # the model's own decode section (beam 3; the packaged model's length penalty 1.5)
    "greedy": {"beam_size": 1},
    "beam3": {"beam_size": 3, "length_penalty": 0.0},
    "beam3_nbest3": {"beam_size": 3, "length_penalty": 0.0, "n_best": 3},
    "beam3_lp1.5_trigrams": {"beam_size": 3, "length_penalty": 1.5, "block_trigrams": True},
    "beam3_min6_endings": {"beam_size": 3, "min_length": 6, "suppress_bad_endings": True},
    "beam4_diverse2": {"beam_size": 4, "diverse_groups": 2, "diversity_strength": 0.5, "n_best": 2},
    "beam4_max4": {"beam_size": 4, "max_length": 4},  # cut off: finished and unfinished hypotheses compete
    "sample_seed7": {"sample": True, "temperature": 1.0, "seed": 7, "n_best": 2},
}
# The torch-free runtime's options are a subset: no sampling, no diverse groups.
ONNX_DECODINGS = [name for name,
                  options in DECODINGS.items() if not options.get("sample") and "diverse_groups" not in options]

# The tiny shapes world and models (tests/conftest.py's SHAPES_TINY, a few more epochs).
SHAPES = [
    "data.shapes_num_train=300",
    "data.shapes_num_val=24",
    "data.shapes_num_test=12",
    "data.image_size=64",
    "data.batch_size=16",
    "model.encoder.width=8",
    "model.decoder.dropout=0.0",
    "train.epochs=16",
    "train.lr=3e-3",
    "train.warmup_steps=5",
    "train.early_stopping_patience=0",
    "train.cpu_amp=fp32",
    "train.seed=0",
    "train.threads=1",
    "decode.max_length=20",
]
DECODER = {
    "lstm": ["model.decoder.embed_dim=32", "model.decoder.hidden_dim=64", "model.decoder.attention_dim=32"],
    "transformer": ["model.decoder.d_model=32", "model.decoder.num_layers=1", "model.decoder.num_heads=2",
                    "model.decoder.ff_dim=64", "train.lr=3e-3", "train.warmup_steps=5"],
}


def train_models(work: Path) -> None:
    """Train both tiny models, keep their best.pt (without optimizer state), export the LSTM,
    and copy the first test pictures of the world they trained on."""
    import torch

    from captioner.apps.cli import main

    torch.set_num_threads(1)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    world = work / "shapes"
    for kind, overrides in DECODER.items():
        run = work / kind
        config = ROOT / "configs" / f"shapes_{kind}.yaml"
        args = ["train", str(config), *SHAPES, *overrides, f"data.root={world}", f"train.out_dir={run}"]
        if main(args) != 0:
            raise SystemExit(f"training {kind} failed")
        slim(run / "best.pt", CHECKPOINTS[kind])
    shutil.rmtree(EXPORT, ignore_errors=True)
    if main(["export", str(CHECKPOINTS["lstm"]), str(EXPORT), "--onnx", "--image",
             str(sorted((world / "test").iterdir())[0])]) != 0:
        raise SystemExit("export failed")
    (EXPORT / "attention.png").unlink()  # the model card's figure (~0.7 MB): loading never reads it
    shutil.rmtree(PICTURES, ignore_errors=True)
    PICTURES.mkdir()
    from PIL import Image

    for path in sorted((world / "test").iterdir())[:PICTURE_COUNT]:
        Image.open(path).convert("RGB").save(PICTURES / f"{path.stem}.png", optimize=True)


DROPPED = ("optimizer", "scheduler", "scaler", "ema", "rng")


def slim(source: Path, target: Path) -> None:
    """best.pt as `captioner train` wrote it, less what loading a model never reads (the optimizer's
    and scheduler's state): the payload's own format otherwise."""
    import torch

    from captioner.models.checkpoint_format import write_checkpoint_file

    payload = torch.load(source, map_location="cpu", weights_only=True)
    write_checkpoint_file({k: v for k, v in payload.items() if k not in DROPPED}, target)


def layout(state_dict: dict) -> dict[str, list[int]]:
    """name -> shape of a state dict, sorted by name."""
    return {name: list(tensor.shape) for name, tensor in sorted(state_dict.items())}


def stored_layouts() -> dict[str, dict[str, list[int]]]:
    """The state dicts' names and shapes as the committed files hold them (read without captioner)."""
    import torch
    from safetensors.torch import load_file

    layouts = {kind: layout(torch.load(path, map_location="cpu", weights_only=True)["model"]) for kind,
               path in CHECKPOINTS.items()}
    layouts["export_lstm"] = layout(load_file(EXPORT / "model.safetensors"))
    return layouts


def file_checksums() -> dict[str, str]:
    """sha256 of every committed model file (relative path -> hex), pictures included."""
    import hashlib

    files = sorted(p for p in GOLDEN.rglob("*") if p.is_file() and p != CAPTIONS and p.name != "README.md")
    return {p.relative_to(GOLDEN).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def record_caption(caption: Any) -> dict[str, Any]:
    """A caption as captions.json holds it: words, ids, scores as repr(float), and its attention
    maps (T, L, H, h, w) by shape and the sha256 of their float32 bytes."""
    import hashlib

    import numpy as np

    attn = caption.attn.numpy() if hasattr(caption.attn, "numpy") else caption.attn
    attn = np.ascontiguousarray(attn, dtype=np.float32)
    return {"text": caption.text, "tokens": [int(t) for t in caption.tokens], "score": repr(float(caption.score)),
            "logprob": repr(float(caption.logprob)), "finished": bool(caption.finished),
            "attn_shape": list(attn.shape), "attn_sha256": hashlib.sha256(attn.tobytes()).hexdigest()}


def caption_all(model: Any, images: list) -> dict[str, Any]:
    """Every decoding of DECODINGS on `images` (paths) with a torch Captioner, through its public
    `caption` (one batch): name -> image name -> its captions, best first (one unless n_best)."""
    out: dict[str, Any] = {}
    for name, options in DECODINGS.items():
        options = dict(options)
        n_best = options.pop("n_best", 1)
        ranked = model.caption([str(p) for p in images], n_best=n_best, **options)
        out[name] = {Path(path).name: [record_caption(c) for c in captions] for path,
                     captions in zip(images, ranked, strict=True)}
    return out


def onnx_captions(folder: Path, images: list) -> dict[str, Any]:
    """The ONNX bundle in `folder`, decoded by the torch-free runtime (numpy search)."""
    from captioner.deploy.runtime import OnnxCaptioner

    runtime = OnnxCaptioner.from_folder(folder, threads=1)
    out: dict[str, Any] = {}
    for name in ONNX_DECODINGS:
        options = dict(DECODINGS[name])
        n_best = options.pop("n_best", None)
        ranked = runtime.caption([str(p) for p in images], n_best=n_best, errors="return", **options)
        out[name] = {Path(p).name: [record_caption(c) for c in (r if isinstance(r, list) else [r])] for p,
                     r in zip(images, ranked)}
    return out


def fresh_onnx_export(work: Path) -> Path:
    """export_lstm's model exported to ONNX again by today's code, into `work`."""
    from captioner import Captioner
    from captioner.models.onnx_export import export_onnx

    export_onnx(Captioner.from_pretrained(EXPORT, device="cpu"), work)
    return work


def flickr_photos(shared: Path, count: int = PHOTO_COUNT) -> list[Path]:
    """The first `count` Flickr8k test photographs (by name), as scripts/packaged_captions.py picks them."""
    names = sorted(line.strip() for line in (shared / "flickr8k" / "Flickr_8k.testImages.txt").read_text().splitlines()
                   if line.strip())
    folder = shared / "flickr8k" / "images"
    return [folder / name for name in names if (folder / name).is_file()][:count]


def shared_folder() -> Path:
    return Path(os.environ.get("CAPTIONER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def has_onnxruntime() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


@contextmanager
def pinned_arithmetic() -> Iterator[bool]:
    """One thread, and the dense layers' products through oneDNN where this torch has it: a
    route otherwise chosen by timing it (models/products.py), which sums in another order than
    F.linear and so would change the last bits of the scores from one measurement to the next.
    Yields whether the oneDNN route is taken; puts both settings back after."""
    import torch

    from captioner.models import products

    threads, kept = torch.get_num_threads(), (products._ENABLED, products._CHECKED)
    torch.set_num_threads(1)
    products.set_onednn(True)
    try:
        yield products.route_taken()
    finally:
        torch.set_num_threads(threads)
        products._ENABLED, products._CHECKED = kept


def golden_record(shared: Path | None, onnx: bool) -> dict[str, Any]:
    """Everything captions.json holds, computed now from the committed files (and `shared`)."""
    with pinned_arithmetic() as onednn:
        return {**_golden_record(shared, onnx), "onednn_products": onednn}


def _golden_record(shared: Path | None, onnx: bool) -> dict[str, Any]:
    import torch

    from captioner import Captioner, default_model
    from captioner.core.machine_cache import machine_key

    pictures = sorted(PICTURES.glob("*.png"))
    record: dict[str, Any] = {"made_on": machine_key(), "torch": torch.__version__, "decodings": DECODINGS,
                              "pictures": [p.name for p in pictures], "layouts": stored_layouts(),
                              "files": file_checksums(), "shapes": {}}
    for name, path in [*CHECKPOINTS.items(), ("export_lstm", EXPORT)]:
        record["shapes"][name] = caption_all(Captioner.from_pretrained(path, device="cpu"), pictures)
    if onnx:
        record["onnx_export_lstm"] = onnx_captions(EXPORT, pictures)
    if shared is not None:
        photos = flickr_photos(shared)
        model = default_model("cpu")
        record["flickr8k"] = {"model": model.origin.name, "photos": [p.name for p in photos],
                              "captions": caption_all(model, photos)}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", action="store_true",
                        help="train the two tiny models again, export one and copy the pictures first")
    parser.add_argument("--no-onnx", action="store_true", help="leave out the ONNX runtime's captions")
    parser.add_argument("--out", type=Path, default=CAPTIONS)
    args = parser.parse_args(argv)
    from captioner.apps.cli import refused
    from captioner.core.errors import CaptionerError
    from captioner.core.files import check_writable_file, write_atomically

    os.environ.setdefault("CAPTIONER_THREADS", "1")
    shared = shared_folder()
    try:  # the shared folder and --out are checked before anything is trained or decoded
        if not shared.is_dir():
            raise CaptionerError(f"{shared}: shared data folder not found (set CAPTIONER_SHARED_DATA): the Flickr8k "
                                 "photographs are part of the record")
        check_writable_file(args.out)
        if args.models:
            with tempfile.TemporaryDirectory() as work:
                train_models(Path(work))
        text = json.dumps(golden_record(shared, onnx=not args.no_onnx and has_onnxruntime()), indent=1) + "\n"
        write_atomically(args.out, lambda tmp: tmp.write_text(text))
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
