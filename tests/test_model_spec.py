"""The model spec: one description of a model that the checkpoint, the export's config.json and the
ONNX bundle's onnx.json carry, the decoder registry that builds each decoder from its own config
class, and the files written before the spec (tests/data/golden/) read into the same spec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model

from captioner.core.config import decoder_config
from captioner.core.decoder_types import decoder_type, registered
from captioner.core.errors import CheckpointError, ConfigError
from captioner.core.model_spec import SPEC_VERSION, ModelSpec
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import save_checkpoint
from captioner.models.checkpoint_format import checkpoint_spec, read_checkpoint
from captioner.models.decoder import build_decoder
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder
from captioner.models.decoders.transformer import TransformerConfig
from captioner.models.export_format import read_exported

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
DECODER_OVERRIDES = {
    "lstm": ("model.decoder.type=lstm",),
    "transformer": ("model.decoder.type=transformer", "model.decoder.d_model=16", "model.decoder.num_heads=2",
                    "model.decoder.ff_dim=32"),
}


def test_every_decoder_config_has_its_builder_and_reads_only_its_keys() -> None:
    assert registered() == list(DECODER_OVERRIDES)
    lstm = decoder_config({"type": "lstm", "hidden_dim": 24}, "test")
    assert lstm == LSTMConfig(embed_dim=256, hidden_dim=24, attention_dim=256, dropout=0.5)
    assert decoder_config({"type": "lstm", "d_model": 99}, "test") == LSTMConfig()  # d_model: not the LSTM's
    transformer = decoder_config({"type": "transformer", "d_model": 32, "num_heads": 4}, "test")
    assert transformer == TransformerConfig(d_model=32, num_heads=4)
    assert isinstance(build_decoder(LSTMConfig(), vocab_size=10, feat_dim=8), LSTMDecoder)
    for name in registered():
        entry = decoder_type(name)
        decoder = build_decoder(entry.config(), vocab_size=10, feat_dim=8)
        assert type(decoder) is entry.module and decoder.__class__.__name__.lower().startswith(name)


@pytest.mark.parametrize("kind", list(DECODER_OVERRIDES))
def test_a_spec_survives_json_and_builds_the_same_model(kind: str) -> None:
    model = tiny_model(*DECODER_OVERRIDES[kind], "decode.beam_size=4")
    spec = model.spec(model.grid_size())
    raw = json.loads(json.dumps(spec.to_dict()))
    assert raw["spec_version"] == SPEC_VERSION and raw["decoder"]["type"] == kind
    assert set(raw["decoder"]) == {"type", *(f.name for f in dataclasses.fields(decoder_type(kind).config))}
    again = ModelSpec.from_dict(raw, "test")
    assert again == spec
    rebuilt = Captioner.from_spec(again)
    assert rebuilt.load_state_dict(model.state_dict()) is not None and rebuilt.spec(rebuilt.grid_size()) == spec
    assert rebuilt.decode_config.beam_size == 4
    without_words = spec.to_dict(with_vocab=False)
    assert "vocab" not in without_words and ModelSpec.from_dict(without_words, "test", list(spec.vocab)) == spec


def test_a_spec_that_does_not_hold_is_one_line_naming_its_source() -> None:
    raw = tiny_model().spec().to_dict()
    for edit, fragment in [
        ({"spec_version": 99}, "spec_version 99 is not supported"),
        ({"decoder": {**raw["decoder"], "bogus": 1}}, "unknown key 'model.decoder.bogus'"),
        ({"special_tokens": {**raw["special_tokens"], "eos": 7}}, "are not the vocabulary's"),
        ({"vocab": ["a", "b"]}, "vocab must start with <pad>"),
        ({"vocab": 5, "vocab_size": 5}, "vocab must be a list of words"),  # not a TypeError from len()
        # a word of a stranger's model that would end the printed caption's line or steer the terminal
        ({"vocab": [*raw["vocab"][:5], "a\nforged\x1b[2J"]}, "vocab word 5 'a\\nforged\\x1b[2J' is empty or holds"),
        ({"vocab": [*raw["vocab"][:5], "two words"]}, "vocab word 5 'two words' is empty or holds a space"),
        ({"vocab": [*raw["vocab"][:5], ""]}, "vocab word 5 '' is empty"),
        ({"grid": [0, 3]}, "grid must be [h, w]"),
        ({"preprocessing": {**raw["preprocessing"], "std": [0, 0, 0]}}, "preprocessing.std must be above 0"),
        ({"preprocessing": {**raw["preprocessing"], "mean": [0.5]}}, "preprocessing.mean must be 3 finite numbers"),
    ]:
        with pytest.raises(ConfigError) as error:
            ModelSpec.from_dict({**raw, **edit}, "somewhere.json (spec)")
        assert str(error.value).startswith("somewhere.json (spec): ") and fragment in str(error.value), str(error.value)
        assert "\n" not in str(error.value)


def test_a_checkpoint_carries_the_spec_and_one_without_it_reads_its_config(tmp_path: Path) -> None:
    model = tiny_model()
    save_checkpoint(tmp_path / "new.pt", model)
    payload = read_checkpoint(tmp_path / "new.pt")
    assert ModelSpec.from_dict(payload["spec"], "test") == model.spec()
    del payload["spec"]  # as written before the spec
    assert checkpoint_spec(payload, tmp_path / "old.pt") == model.spec().__class__(**{
        **{f.name: getattr(model.spec(), f.name) for f in dataclasses.fields(model.spec())},
        "preprocessing": dataclasses.replace(model.spec().preprocessing, mean=None, std=None),  # not recorded then
        "feature_dim": None,
    })
    payload["config"]["model"]["decoder"]["bogus"] = 1
    with pytest.raises(CheckpointError, match=r"old\.pt: incompatible config: .*bogus"):
        checkpoint_spec(payload, tmp_path / "old.pt")


@pytest.mark.parametrize("name", ["lstm.pt", "transformer.pt"])
def test_a_checkpoint_from_before_the_spec_loads_and_saves_in_the_new_format(name: str, tmp_path: Path) -> None:
    old = GOLDEN / name
    payload = read_checkpoint(old)
    assert "spec" not in payload  # the golden files are the old format, never rewritten
    model = Captioner.from_pretrained(old, device="cpu")
    assert model.spec().decoder == checkpoint_spec(payload, old).decoder
    save_checkpoint(tmp_path / "again.pt", model)
    again = Captioner.from_pretrained(tmp_path / "again.pt", device="cpu")
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[key]), key
    images = torch.randint(0, 256, (2, 3, model.image_size, model.image_size), dtype=torch.uint8)
    assert [c.tokens for c in model.caption(images, beam_size=3)] == [c.tokens
                                                                      for c in again.caption(images, beam_size=3)]


def test_an_export_from_before_the_spec_reads_into_the_spec_of_its_checkpoint() -> None:
    folder = GOLDEN / "export_lstm"
    config = json.loads((folder / "config.json").read_text())
    assert config["format_version"] == 1 and "spec" not in config
    exported = read_exported(folder)
    checkpoint = Captioner.from_pretrained(GOLDEN / "lstm.pt", device="cpu").spec()
    assert exported.spec.decoder == checkpoint.decoder and exported.spec.vocab == checkpoint.vocab
    assert exported.spec.decode == checkpoint.decode and exported.spec.preprocessing == checkpoint.preprocessing
    assert exported.spec.grid == tuple(config["encoder"]["grid"])


def test_an_onnx_bundle_from_before_the_spec_is_read_into_the_spec_its_checkpoint_has() -> None:
    pytest.importorskip("onnxruntime")
    from captioner.deploy.runtime import load_bundle

    manifest = json.loads((GOLDEN / "export_lstm" / "onnx" / "onnx.json").read_text())
    assert manifest["format_version"] == 1 and "spec" not in manifest
    bundle = load_bundle(GOLDEN / "export_lstm")
    spec = Captioner.from_pretrained(GOLDEN / "lstm.pt", device="cpu").spec()
    assert bundle.vocab.to_list() == list(spec.vocab)
    upgraded = bundle.spec  # read into today's spec (core/upgrade.py)
    assert (upgraded.vocab, upgraded.special, upgraded.decode, upgraded.preprocessing.image_size,
            upgraded.decoder_type) == (
        spec.vocab, spec.special, spec.decode, spec.preprocessing.image_size, spec.decoder_type)
    assert (bundle.special, bundle.image_size, bundle.decode) == (spec.special, spec.preprocessing.image_size,
                                                                  dataclasses.asdict(spec.decode))
