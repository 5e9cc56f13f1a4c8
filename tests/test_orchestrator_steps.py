"""The steps the orchestrators are made of, each tested alone: feature extraction, a run's setup,
the self-critical objective, the demo page and `evaluate CHECKPOINT`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.core.errors import CaptionerError
from captioner.data.records import ImageRecord
from captioner.data.store_extract import encode_block, new_manifest, record_failures
from captioner.training.distributed import Distributed
from helpers import tiny_config, tiny_model, tiny_vocab


class Halving:
    """A stand-in encoder: each image becomes 2 cells of 3 values, image i's values all i / 2."""

    device = torch.device("cpu")

    def stored_part(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        values = images[:, 0, 0, 0].float() / 2  # (B,)
        return values[:, None, None].expand(-1, 2, 3).contiguous(), (1, 2)  # (B, 2, 3)


def records(count: int) -> list[ImageRecord]:
    return [ImageRecord(100 + i, Path(f"img{i}.jpg"), ("a red circle",)) for i in range(count)]


def test_encode_block_puts_each_loaded_image_in_its_row_and_leaves_failed_ones_zero() -> None:
    # The batch's third record failed to load: the loader gave the other three, indexed from
    # 10 records before this batch (where the run resumed).
    images = torch.tensor([2.0, 4.0, 8.0])[:, None, None, None].expand(-1, 3, 4, 4)  # (3, 3, 4, 4)
    indices = torch.tensor([10, 11, 13])  # (3,)
    block, loaded = encode_block(Halving(), (images, indices), 4, 10, (2, 3))
    assert block.dtype == np.float16 and block.shape == (4, 2, 3)
    assert loaded == {0, 1, 3}
    assert block[:, 0, 0].tolist() == [1.0, 2.0, 0.0, 4.0]
    empty, none = encode_block(Halving(), None, 2, 0, (2, 3))
    assert none == set() and not empty.any()


def test_record_failures_names_each_row_that_did_not_load(caplog: pytest.LogCaptureFixture) -> None:
    manifest = new_manifest("val", {"encoder.name": "x"}, (1, 2), 3, records(6))
    assert manifest["shape"] == [6, 2, 3] and manifest["rows_done"] == 0 and manifest["image_ids"][0] == 100
    with caplog.at_level(logging.WARNING, logger="captioner.data.store_extract"):
        record_failures(manifest, records(6), 3, 3, {1}, "val")
    assert [f["row"] for f in manifest["failed"]] == [3, 5]
    assert [f["image_id"] for f in manifest["failed"]] == [103, 105]
    assert len(caplog.records) == 2


def test_run_setup_steps_pick_the_loader_and_objective_the_stage_needs() -> None:
    from captioner.data.batching import CaptionDataset
    from captioner.data.image_transform import ImageTransform
    from captioner.training.loop import caption_loss
    from captioner.training.run_setup import make_loader, make_objective, uses_feature_store, wrap_for_ddp

    config = tiny_config("data.batch_size=2", "data.num_workers=3")
    model = tiny_model()
    ctx = Distributed(torch.device("cpu"))
    on_device = torch.zeros(5, 4, 8)  # (R, N, D): rows already in memory
    train_set = CaptionDataset(records(5), model.vocab, ImageTransform(32, train=True), 8, "one", on_device)
    loader, sampler = make_loader(config, ctx, train_set, None, model.vocab)
    assert loader.batch_sampler is sampler and sampler.batch_size == 2 and len(sampler) == 2  # whole batches only
    assert loader.num_workers == 0 and not loader.pin_memory  # rows in memory are indexed in this process
    assert make_objective(config, model, train_set) is caption_loss
    assert wrap_for_ddp(model, config, ctx) is model  # one process: no DDP wrapper
    assert not uses_feature_store(config, model, None)  # a tiny model's encoder has no frozen pretrained blocks


def test_scst_logged_means_are_this_ranks_share_of_each_mean() -> None:
    from captioner.core.config_sections import ScstConfig
    from captioner.models.decoding.sampling import SampledCaptions
    from captioner.training.scst import SelfCritical

    vocab = tiny_vocab()
    objective = SelfCritical(ScstConfig(samples=2, baseline="mean", max_length=4), vocab, [],
                             lambda t, n, i: torch.zeros(len(t)))
    tokens = torch.tensor([[5, vocab.eos_id, 0], [5, 6, vocab.eos_id]])  # (2, 3): 1 and 2 words, then <eos>
    mask = torch.tensor([[True, True, False], [True, True, True]])  # (2, 3)
    samples = SampledCaptions(tokens, torch.zeros(2, 3), mask, torch.tensor([2, 3]), torch.tensor([0, 0]))
    logprobs = torch.tensor([-2.0, -6.0])  # (2,)
    rewards, baseline = torch.tensor([1.0, 0.5]), torch.tensor([0.5, 1.0])  # (2,)
    logged = objective.logged_means(samples, logprobs, rewards, baseline, 0.5, 3.0)
    got = {k: round(v.item(), 4) for k, v in logged.items()}
    assert got == {"reward": 0.375, "baseline": 0.375, "advantage": 0.0, "advantage_abs": 0.25, "sample_length": 0.75,
                   "sample_logprob": -0.75, "reward_seconds": 1.5}  # (-2/2 - 6/3) / 2, halved


def test_scst_mean_baseline_is_the_mean_of_the_other_samples() -> None:
    from captioner.core.config_sections import ScstConfig
    from captioner.training.scst import SelfCritical

    model = tiny_model()
    objective = SelfCritical(ScstConfig(samples=3, baseline="mean", max_length=4), model.vocab, [],
                             lambda t, n, i: torch.zeros(len(t)))
    rewards = torch.tensor([0.0, 3.0, 6.0, 1.0, 1.0, 4.0])  # (B*n,): two images, three samples each
    baseline = objective.baseline(model, torch.zeros(2, 4, 16), torch.arange(2), rewards)
    assert baseline.tolist() == [4.5, 3.0, 1.5, 2.5, 2.5, 1.0]


def test_demo_steps_start_the_sliders_within_the_page_and_round_lifetimes() -> None:
    pytest.importorskip("gradio")
    from captioner.apps.demo.page import MAX_BEAM, MAX_LENGTH
    from captioner.apps.demo.ui import Cleanup, cache_lifetimes, slider_starts

    model = tiny_model("decode.beam_size=3", "decode.max_length=7")
    assert slider_starts(model) == (min(3, MAX_BEAM), min(7, MAX_LENGTH))
    wide = tiny_model(f"decode.max_length={MAX_LENGTH + 5}")
    assert slider_starts(wide)[1] == MAX_LENGTH
    assert cache_lifetimes(Cleanup(every_s=0.2, max_age_s=3.6)) == (1, 4)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"checkpoint": None}, "give a CHECKPOINT"),
        ({"saliency": "gradcam"}, "--saliency scores saliency maps against instance masks; it needs --grounding"),
        ({"ensemble": ["b.pt"], "features": "store"}, "--features works on one model"),
        ({"ensemble": ["b.pt"], "saliency": "gradcam", "grounding": True}, "--saliency works on one model"),
        ({"heatmaps": "maps"}, "--heatmaps draws the grounded words' maps over their regions; it needs --grounding"),
    ],
)
def test_evaluate_checkpoint_refuses_flags_that_do_not_go_together(flags: dict, error: str) -> None:
    from captioner.apps.commands.evaluate import check_checkpoint_arguments

    alone = {"checkpoint": "a.pt", "saliency": None, "grounding": False, "ensemble": [], "features": None,
             "heatmaps": None}
    with pytest.raises(CaptionerError, match=error):
        check_checkpoint_arguments(argparse.Namespace(**{**alone, **flags}))
    check_checkpoint_arguments(argparse.Namespace(**alone))
