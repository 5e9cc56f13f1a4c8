"""The golden captions, the safety net of a refactor: the models in tests/data/golden/, written before the
model description, the decoding and the exports were refactored, still load and still say exactly
what tests/data/golden/captions.json records, for every decoding of scripts/golden_captions.py
(greedy, beam, n-best, length penalty with trigram blocking, the ending rule, diverse groups,
cut-off beams, seeded sampling), both decoders, the checkpoint, the export, the ONNX bundle through
the torch-free runtime and the packaged model on Flickr8k photographs.

On the machine (processor, cores, torch, kernel variables) that wrote the file, on one thread and the same route
for the dense layers' products, the record is equal byte for byte: texts, token ids, every score
as repr(float) and the attention maps' float32 bytes (by checksum). Elsewhere, where other kernels sum in other orders
(tests/test_packaged_captions.py's reasoning), greedy captions are worded the same, every score of a
caption worded the same is within SCORE_TOLERANCE of the recorded one (its attention maps of the
recorded shape), and at most one caption in
six of the other decodings is worded otherwise (a near tie in a beam or a draw may fall the other
way).

The committed model files are the "from before" files: their checksums, state dict names and
shapes are recorded, so that they are never rewritten in the new format (which would make the
loading test hold nothing). `python scripts/golden_captions.py` rewrites captions.json only when a
change of the captions is meant (say so in the commit).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest
from helpers import require, require_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = runpy.run_path(str(ROOT / "scripts" / "golden_captions.py"))
EXPECTED = json.loads(Path(SCRIPT["CAPTIONS"]).read_text())
SCORE_TOLERANCE = 0.02  # a length-normalised log-probability; fp32 reorderings move it by ~1e-5
SHAPES_MODELS = ["lstm", "transformer", "export_lstm"]


@pytest.fixture(autouse=True)
def pinned_arithmetic():
    """As the record was made: one thread, the dense layers' products on the route it names
    (timing would pick one per test session, and the two routes differ in the last bits)."""
    with SCRIPT["pinned_arithmetic"]() as onednn:
        yield onednn


def same_machine() -> bool:
    """Whether the captions must be the recorded ones byte for byte: the same processor, cores and
    torch, and the same products route (CAPTIONER_ONEDNN=0 turns it off)."""
    from captioner.core.machine_cache import machine_key
    from captioner.models import products

    return machine_key() == EXPECTED["made_on"] and products.route_taken() == EXPECTED["onednn_products"]


def assert_as_recorded(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """`got` and `want`: decoding name -> image name -> captions (best first) as record_caption
    writes them."""
    assert list(got) == list(want), f"{what}: other decodings than recorded"
    if same_machine():
        for name in want:
            assert got[name] == want[name], (f"{what}, {name}: not the recorded captions "
                                             f"(byte for byte on {EXPECTED['made_on']}): "
                                             f"{first_difference(got[name], want[name])}")
        return
    for name in want:
        pairs = [(g, w) for image in want[name] for g, w in zip(got[name][image], want[name][image], strict=True)]
        reworded = [(g["text"], w["text"]) for g, w in pairs if g["text"] != w["text"]]
        if name == "greedy":
            assert not reworded, f"{what}, greedy: worded otherwise than recorded: {reworded}"
        assert len(reworded) <= len(pairs) // 6, f"{what}, {name}: worded otherwise than recorded: {reworded}"
        far = [(g["text"], g["score"], w["score"]) for g, w in pairs
               if g["text"] == w["text"] and abs(float(g["score"]) - float(w["score"])) > SCORE_TOLERANCE]
        assert not far, f"{what}, {name}: scores beyond {SCORE_TOLERANCE} of the recorded ones: {far}"
        shapes = [(g["text"], g["attn_shape"], w["attn_shape"]) for g,
                  w in pairs if g["text"] == w["text"] and g["attn_shape"] != w["attn_shape"]]
        assert not shapes, f"{what}, {name}: attention maps of other shapes than recorded: {shapes}"


def first_difference(got: dict[str, list[dict]], want: dict[str, list[dict]]) -> str:
    """The first caption that differs from the record, and how, for the failure message."""
    for image, captions in want.items():
        for rank, (g, w) in enumerate(zip(got.get(image, []), captions)):
            if g != w:
                return f"{image} #{rank}: got {g}, recorded {w}"
        if len(got.get(image, [])) != len(captions):
            return f"{image}: {len(got.get(image, []))} captions, recorded {len(captions)}"
    return f"other images: {sorted(got)} (recorded {sorted(want)})"


def pictures() -> list[Path]:
    found = sorted(Path(SCRIPT["PICTURES"]).glob("*.png"))
    assert [p.name for p in found] == EXPECTED["pictures"]
    return found


def test_the_old_model_files_are_the_ones_recorded() -> None:
    """The checkpoints, the export and its ONNX bundle from before the refactor are still those
    files (checksums), and their state dicts, read with weights_only and safetensors alone,
    hold the names and shapes recorded."""
    assert SCRIPT["file_checksums"]() == EXPECTED["files"], (
        "tests/data/golden/: the model files from before the refactor were changed (never rewrite them)")
    assert SCRIPT["stored_layouts"]() == EXPECTED["layouts"]
    assert SCRIPT["DECODINGS"] == EXPECTED["decodings"]


@pytest.mark.parametrize("name", SHAPES_MODELS)
def test_old_shapes_models_load_and_caption_as_recorded(name: str) -> None:
    from captioner import Captioner

    path = {**SCRIPT["CHECKPOINTS"], "export_lstm": SCRIPT["EXPORT"]}[name]
    model = Captioner.from_pretrained(path, device="cpu")
    loaded = SCRIPT["layout"](model.state_dict())
    assert (loaded
            == EXPECTED["layouts"][name]), f"{name}: the loaded model's weights are laid out otherwise than the file's"
    assert_as_recorded(SCRIPT["caption_all"](model, pictures()), EXPECTED["shapes"][name], name)


def test_the_old_onnx_bundle_captions_as_recorded() -> None:
    """The committed ONNX bundle (export_lstm/onnx), through the torch-free runtime's numpy search."""
    require_module("onnxruntime", "the ONNX runtime needs onnxruntime (pip install captioner[onnx])")
    assert_as_recorded(SCRIPT["onnx_captions"](Path(SCRIPT["EXPORT"]), pictures()), EXPECTED["onnx_export_lstm"],
                       "export_lstm/onnx")


def test_a_fresh_onnx_export_captions_as_the_old_bundle(tmp_path: Path) -> None:
    """Today's ONNX exporter, on the old export's model, gives the recorded captions too."""
    require_module("onnxruntime", "the ONNX runtime needs onnxruntime (pip install captioner[onnx])")
    require_module("onnx", "the ONNX export needs onnx (pip install captioner[onnx])")
    folder = SCRIPT["fresh_onnx_export"](tmp_path)
    assert_as_recorded(SCRIPT["onnx_captions"](folder, pictures()), EXPECTED["onnx_export_lstm"], "a fresh ONNX export")


def test_the_packaged_model_captions_flickr8k_photographs_as_recorded(shared_data: Path) -> None:
    from captioner import default_model

    photos = SCRIPT["flickr_photos"](shared_data)
    require(len(photos) == len(EXPECTED["flickr8k"]["photos"]),
            f"{shared_data}: fewer Flickr8k test photographs than recorded")
    assert [p.name for p in photos] == EXPECTED["flickr8k"]["photos"]
    model = default_model("cpu")
    assert model.origin.name == EXPECTED["flickr8k"]["model"]
    assert_as_recorded(SCRIPT["caption_all"](model, photos), EXPECTED["flickr8k"]["captions"], "the packaged model")


@pytest.mark.parametrize("name, writer", [("lstm", "save_pretrained"), ("transformer", "save_pretrained"),
                                          ("transformer", "save_checkpoint")])
def test_an_old_model_written_again_today_captions_as_recorded(name: str, writer: str, tmp_path: Path) -> None:
    """An old model loaded and written again by today's code, as an export or a checkpoint, reads
    back to the same captions: what the writers write, the loaders read whole."""
    from captioner import Captioner
    from captioner.models.checkpoint import save_checkpoint

    model = Captioner.from_pretrained(SCRIPT["CHECKPOINTS"][name], device="cpu")
    path = tmp_path / "model.pt" if writer == "save_checkpoint" else tmp_path / "export"
    if writer == "save_checkpoint":
        save_checkpoint(path, model)
    else:
        model.save_pretrained(path)
    again = Captioner.from_pretrained(path, device="cpu")
    assert SCRIPT["layout"](again.state_dict()) == EXPECTED["layouts"][name]
    assert_as_recorded(SCRIPT["caption_all"](again, pictures()), EXPECTED["shapes"][name], f"{name} after {writer}")
