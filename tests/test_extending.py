"""A decoder of one's own, as docs/extending.md adds it: examples/gru_decoder.py, a file outside the
package, declared by an installed package's entry point (a dist-info folder on sys.path here), trains
on shapes through the command line, beam-searches with heatmaps, exports to safetensors and ONNX, and
captions the same in the torch-free runtime. A config names a type, never code: a module that is
importable but declared nowhere is not imported."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHAPES_TINY, TrainedRun
from helpers import REPO, require_module

from captioner.core import decoder_types
from captioner.core.config import load_config
from captioner.core.errors import ConfigError

EXAMPLE = REPO / "examples" / "gru_decoder.py"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch):
    """The decoder table and sys.modules as they were, after the test (a registration is process-wide)."""
    monkeypatch.setattr(decoder_types, "_TYPES", dict(decoder_types._TYPES))
    monkeypatch.setattr(decoder_types, "_loaded", set(decoder_types._loaded))
    monkeypatch.setattr(decoder_types, "_points", None)  # the entry points as the test installs them
    yield
    sys.modules.pop("my_gru", None)


def installed(site: Path, declared: bool) -> None:
    """examples/gru_decoder.py as the module `my_gru` of a package installed in `site`, its decoder
    declared in the `captioner.decoders` entry point group (or not)."""
    site.mkdir()
    shutil.copy(EXAMPLE, site / "my_gru.py")
    info = site / "my_gru-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-gru\nVersion: 0.1\n")
    if declared:
        (info / "entry_points.txt").write_text("[captioner.decoders]\ngru = my_gru\n")


def test_a_type_resolves_only_among_declared_decoders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      registry) -> None:
    installed(tmp_path / "site", declared=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError,
                       match=r"^command line: 'model.decoder.type' must be one of lstm, transformer; got 'my_gru'$"):
        load_config(None, ["model.decoder.type=my_gru"])
    with pytest.raises(ConfigError, match=r"must be one of lstm, transformer; got 'gru'$"):
        load_config(None, ["model.decoder.type=gru"])
    assert "my_gru" not in sys.modules  # importable, but declared nowhere: never imported
    import my_gru  # noqa: F401  (the user's own import registers it)

    assert type(load_config(None, ["model.decoder.type=gru"]).model.decoder).__name__ == "GRUConfig"


def test_switching_the_type_keeps_what_was_set_for_the_keys_both_decoders_have(tmp_path: Path) -> None:
    (tmp_path / "lstm.yaml").write_text("model:\n  decoder:\n    type: lstm\n    dropout: 0.1\n    hidden_dim: 64\n")
    config = load_config(tmp_path / "lstm.yaml", ["model.decoder.type=transformer", "model.decoder.d_model=32"])
    decoder = config.model.decoder
    assert decoder.type == "transformer" and decoder.dropout == 0.1 and decoder.d_model == 32  # set: kept
    assert decoder.num_heads == 4 and not hasattr(decoder, "hidden_dim")  # the transformer's defaults, its keys alone


def test_a_decoder_from_outside_the_package_trains_exports_and_captions_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry, shapes_lstm: TrainedRun,
) -> None:
    require_module("onnxruntime", "the torch-free runtime's check")
    from captioner import Captioner
    from captioner.apps.cli import main
    from captioner.deploy.runtime import OnnxCaptioner

    installed(tmp_path / "site", declared=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config = load_config(None, ["model.decoder.type=gru", "model.decoder.hidden_dim=48"])  # the entry point imports it
    assert type(config.model.decoder).__name__ == "GRUConfig" and config.model.decoder.hidden_dim == 48
    assert config.to_dict()["model"]["decoder"] == {"type": "gru", "embed_dim": 128, "hidden_dim": 48,
                                                     "attention_dim": 128, "dropout": 0.3}
    run = tmp_path / "run"
    args = ["train", str(REPO / "configs/shapes_lstm.yaml"), *SHAPES_TINY, "model.decoder.type=gru", "train.epochs=2",
            f"data.root={shapes_lstm.shapes}", f"train.out_dir={run}"]
    assert main(args) == 0
    model = Captioner.from_pretrained(run / "best.pt", device="cpu")
    assert type(model.decoder).__name__ == "GRUDecoder" and model.config.decoder.type == "gru"
    images = [str(p) for p in shapes_lstm.test_images[:4]]
    beams = model.caption(images, beam_size=3)
    h, w = model.grid_size()
    assert all(c.attn.shape == (len(c.tokens), 1, 1, h, w) for c in beams)  # a heatmap per word
    export = tmp_path / "export"
    assert main(["export", str(run / "best.pt"), str(export), "--onnx"]) == 0
    again = Captioner.from_pretrained(export, device="cpu").caption(images, beam_size=3)
    assert [c.tokens for c in again] == [c.tokens for c in beams]
    runtime = OnnxCaptioner.from_folder(export / "onnx", threads=1)
    onnx = runtime.caption(images, beam_size=3)
    assert [c.tokens for c in onnx] == [c.tokens for c in beams]
    for got, want in zip(onnx, beams):
        np.testing.assert_allclose(got.attn, want.attn.numpy(), atol=1e-4)
