"""Checkpoints: state dicts + config + vocabulary, weights_only loading, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import tiny_model

from captioner.core.errors import CheckpointError
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config, load_captioner, save_checkpoint
from captioner.models.checkpoint_format import read_checkpoint


def test_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    model = tiny_model()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, step=7)
    payload = torch.load(path, weights_only=True)  # no code can run while loading
    assert payload["step"] == 7 and payload["vocab"] == model.vocab.words
    loaded = load_captioner(path, device="cpu")
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(0, len(model.vocab), (2, 5))
    torch.testing.assert_close(loaded(images, tokens).logits, model(images, tokens).logits, rtol=0, atol=0)
    a, b = model.caption(images, beam_size=2), loaded.caption(images, beam_size=2)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert loaded.config == model.config and loaded.spec() == model.spec()


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_captioner(tmp_path / "none.pt")


def test_corrupt_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="bad.pt: not a readable captioner checkpoint"):
        load_captioner(tmp_path / "bad.pt")


def test_pickled_module_is_refused(tmp_path: Path) -> None:
    """A checkpoint that pickles a whole module (the tutorial habit) would run code: refused."""
    torch.save({"model": tiny_model(), "config": {}, "vocab": []}, tmp_path / "module.pt")
    with pytest.raises(CheckpointError, match="not a readable captioner checkpoint"):
        load_captioner(tmp_path / "module.pt")


def test_not_a_captioner_checkpoint(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="lacks model, config or vocab"):
        load_captioner(tmp_path / "other.pt")


def test_incompatible_weights(tmp_path: Path) -> None:
    model = tiny_model()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model)
    payload = torch.load(path, weights_only=True)
    payload["spec"]["decoder"]["hidden_dim"] = 40  # the spec no longer fits the weights
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="do not fit the model"):
        load_captioner(path)
    payload["spec"]["decoder"]["bogus"] = 1
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="incompatible config.*bogus"):
        load_captioner(path)
    payload["format_version"] = 99
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="format 99 is not supported"):
        load_captioner(path)



@pytest.mark.parametrize("key, value, says", [("model", [1, 2], "its model is not a mapping of names to tensors"),
                                              ("model", {1: torch.zeros(1)}, "its model is not a mapping"),
                                              ("config", [1], "its config is a list, not a mapping"),
                                              ("config", None, "its config is a NoneType, not a mapping")])
def test_a_payload_of_other_shapes_is_one_line_for_every_command(tmp_path: Path, key: str, value: object,
                                                                 says: str, capsys: pytest.CaptureFixture) -> None:
    """A stranger's checkpoint whose model or config is not a mapping (loaded by weights_only as plain data) was an
    AttributeError traceback in caption, export and evaluate; it is one line naming the file."""
    from captioner.apps.cli import main

    path = tmp_path / "model.pt"
    save_checkpoint(path, tiny_model())
    payload = torch.load(path, weights_only=True)
    payload[key] = value
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=says):
        read_checkpoint(path, for_inference=True)
    capsys.readouterr()
    for command in (["export", str(path), str(tmp_path / "out")], ["evaluate", str(path), "--split", "test"]):
        assert main(command) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {path}: not a captioner checkpoint ("), err

def test_a_run_folder_loads_its_best_checkpoint_else_its_last(tmp_path: Path) -> None:
    first, second = tiny_model(seed=1), tiny_model(seed=2)
    save_checkpoint(tmp_path / "last.pt", first)
    assert weights_equal(Captioner.from_pretrained(tmp_path, device="cpu"), first)  # no best.pt yet
    save_checkpoint(tmp_path / "best.pt", second)
    assert weights_equal(Captioner.from_pretrained(tmp_path, device="cpu"), second)
    assert weights_equal(load_captioner(tmp_path / "last.pt", device="cpu"), first)  # a file as given


def weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_what_cannot_be_loaded_is_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointError,
                       match=r"^.*run: a folder without a model \(no best.pt or last.pt, no config.json\)$"):
        Captioner.from_pretrained(tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"^.*missing/model.pt: checkpoint not found "
                                              r"\(no such file, run folder, exported folder or Hub repo id\)$"):
        Captioner.from_pretrained(tmp_path / "missing/model.pt")
    # Neither a file nor a folder: was "checkpoint not found (no such file, ...)", untrue in its words.
    os.mkfifo(tmp_path / "pipe.pt")
    (tmp_path / "dangling.pt").symlink_to(tmp_path / "elsewhere.pt")
    for name in ("pipe.pt", "dangling.pt"):
        with pytest.raises(CheckpointError, match=rf"^.*{name}: not a checkpoint file \(a pipe, a device or a "
                                                  r"socket, or a link that leads nowhere\)$"):
            Captioner.from_pretrained(tmp_path / name)
    # A Hub id is fetched (tests/test_export.py: from the cache, offline); with no network and
    # no cached copy it is one line saying so.


def test_auto_device_is_the_cpu_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path / "model.pt", tiny_model())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_captioner(tmp_path / "model.pt").device == torch.device("cpu")  # device="auto" by default
    assert Captioner.from_pretrained(tmp_path / "model.pt", device="auto").device == torch.device("cpu")


def test_a_model_only_checkpoint_loads_and_has_no_run_config_beyond_its_sections(tmp_path: Path) -> None:
    """What `save_checkpoint(path, model)` writes without a run config (model, input size,
    decoding) loads, and its settings come back unchanged."""
    model = tiny_model("decode.beam_size=4", "decode.length_penalty=0.5")
    save_checkpoint(tmp_path / "model.pt", model)
    loaded = load_captioner(tmp_path / "model.pt", device="cpu")
    assert loaded.settings() == model.settings()
    assert checkpoint_config(tmp_path / "model.pt").decode == model.decode_config


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges this process has mapped from `path` (Linux's /proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            ranges.append((low, high))
    return ranges


def in_ranges(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    return any(low <= tensor.data_ptr() < high for low, high in ranges)


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="no /proc/self/maps to see mappings in")
def test_a_model_is_read_without_its_optimizer_and_keeps_nothing_mapped(tmp_path: Path) -> None:
    """Loading for inference leaves the optimizer's state (two thirds of a fine-tuned COCO checkpoint) on disk:
    the weights are mapped and read as the model copies them. What a caller keeps is in memory, so a
    checkpoint overwritten in place (`cp` over it) cannot fault a model that is serving."""
    model = tiny_model()
    path = tmp_path / "model.pt"
    moments = {"state": {0: {"exp_avg": torch.ones(4096)}}, "param_groups": []}
    save_checkpoint(path, model, optimizer=moments, train_state={"rng": torch.get_rng_state(), "history": []})

    payload = read_checkpoint(path, for_inference=True)
    ranges = mapped_ranges(path)
    assert "optimizer" not in payload and ranges
    assert all(in_ranges(tensor, ranges) for tensor in payload["model"].values())
    assert not in_ranges(payload["train_state"]["rng"], ranges)  # what a model card keeps
    whole = read_checkpoint(path)
    assert whole["optimizer"]["state"][0]["exp_avg"].sum() == 4096  # training's read has it all
    assert not any(in_ranges(tensor, mapped_ranges(path)) for tensor in whole["model"].values())
    assert all(torch.equal(payload["model"][name], tensor) for name, tensor in whole["model"].items())
    del payload, whole

    loaded = load_captioner(path, device="cpu")
    assert weights_equal(loaded, model)
    ranges = mapped_ranges(path)
    assert not any(in_ranges(tensor, ranges) for tensor in loaded.state_dict().values())


@pytest.mark.parametrize("kind", ["folder", "pipe", "dangling link"])
def test_a_run_folder_whose_best_pt_is_not_a_file_is_refused_not_loaded_from_last_pt(kind: str,
                                                                                     tmp_path: Path) -> None:
    """A best.pt that is a folder, a pipe or a link to nothing: one line naming it, where the run folder loaded its
    last.pt instead, another model than the best without a word."""
    from captioner.models.model_paths import checkpoint_file

    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"")
    {"folder": (run / "best.pt").mkdir, "pipe": lambda: os.mkfifo(run / "best.pt"),
     "dangling link": lambda: (run / "best.pt").symlink_to(tmp_path / "elsewhere.pt")}[kind]()
    with pytest.raises(CheckpointError, match=r"^.*run/best\.pt: not a checkpoint file \(a folder, a pipe or a "
                                              r"device, or a link that leads nowhere\); move it aside to load the "
                                              r"run's other checkpoint$"):
        checkpoint_file(run)
