"""A training step never waits on the device: counted on the CPU by simulating a device.

On CUDA, `torch.cuda.set_sync_debug_mode("warn")` reports every synchronising call. On this
CPU-only machine the test simulates the device instead: every tensor that would live on the
GPU (parameters, the batch after `.to(device)`, and all that is computed from them) is tracked
through a TorchDispatchMode, while tensors that stay on the host by design (the caption
lengths, the optimizer's step counters) are not. A read of a tracked tensor's value
(`item`, `bool`, `int`, `float`, `tolist`, numpy), a copy of one to the host (`.cpu()`) or an
op whose output size depends on its values (`nonzero`, boolean-mask indexing) is what would
make the host wait for the GPU. The simulated device is the CPU, so `.to(<the CPU>)` and a
`copy_` into a host tensor look like device work here; tests/cuda_semantics.py's fake CUDA,
where the two devices differ, catches those.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import pytest
import torch
from helpers import WORDS, tiny_config, tiny_model
from package_frames import package_caller
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.data import DataLoader
from torch.utils.weak import WeakTensorKeyDictionary

from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord
from captioner.models.decoding import sampling
from captioner.training import loop, scst
from captioner.training.distributed import Distributed
from captioner.training.loop import train_one_epoch
from captioner.training.run_setup import make_scheduler
from captioner.training.state import TrainState

aten = torch.ops.aten
# ops whose result the host must wait for: a value read, or an output sized by the values
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten.equal.default, aten.is_nonzero.default, aten._unique2.default, aten.unique_consecutive.default}
MASK_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}  # with a boolean mask: sized by it


class DeviceSimulation(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.on_device = WeakTensorKeyDictionary()
        self.syncs: list[str] = []

    def mark(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.on_device[t] = True

    def tracked(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and t in self.on_device

    def record(self, what: str) -> None:
        caller = package_caller(traceback.extract_stack()[:-2])
        self.syncs.append(f"{what} at {caller}" if caller else what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs, _ = tree_flatten((args, kwargs))
        device = any(self.tracked(t) for t in inputs)
        if device and (func in SYNC_OPS or (
            func in MASK_OPS and any(t.dtype == torch.bool for t in inputs if isinstance(t, torch.Tensor)))):
            self.record(str(func))
        out = func(*args, **kwargs)
        if device:
            outputs, _ = tree_flatten(out)
            self.mark(*(t for t in outputs if isinstance(t, torch.Tensor)))
        return out


def watch_reads(sim: DeviceSimulation, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the value reads that bypass the dispatcher on tracked tensors: tolist, numpy, and
    `.cpu()`, which on the CPU returns the tensor itself without an op."""
    for name in ("tolist", "numpy", "__array__", "cpu"):
        original = getattr(torch.Tensor, name)

        def read(self, *args, _original=original, _name=name, **kwargs):
            if sim.tracked(self):
                sim.record(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)
    # The simulated device is the CPU underneath: the loops must not take their host-only paths.
    for module in (sampling, scst, loop):
        monkeypatch.setattr(module, "reads_are_free", lambda device: False)


@pytest.fixture
def simulation(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    sim = DeviceSimulation()
    lengths_on_device = getattr(request, "param", False)
    watch_reads(sim, monkeypatch)
    moved = CaptionBatch.to

    def to_device(self, device, channels_last=False):
        batch = moved(self, device, channels_last)
        sim.mark(batch.images, batch.tokens)  # lengths and indices stay on the host
        if batch.image_rows is not None:  # None: a caption per image, in order
            sim.mark(batch.image_rows)
        if lengths_on_device:
            sim.mark(batch.lengths)
        return batch

    monkeypatch.setattr(CaptionBatch, "to", to_device)
    return sim


def fake_records(tmp_path, n: int) -> list[ImageRecord]:
    from PIL import Image

    records = []
    for i in range(n):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (32, 32), (40 * i % 255, 90, 30)).save(path)
        words = WORDS[i % 5 : i % 5 + 3 + i % 4]  # captions of different lengths
        records.append(ImageRecord(i, path, (" ".join(words), " ".join(reversed(words)))))
    return records


def steps_syncs(tmp_path, simulation: DeviceSimulation, decoder: str) -> list[list[str]]:
    """Syncs per training step over 4 steps, the loss read every 2nd step."""
    config = tiny_config(f"model.decoder.type={decoder}", "train.log_every=2", "data.batch_size=2", "train.device=cpu")
    model = tiny_model(f"model.decoder.type={decoder}").train()
    records = fake_records(tmp_path, 8)
    dataset = CaptionDataset(records, model.vocab, ImageTransform(32, train=True), 20, "one")
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_captions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = make_scheduler(optimizer, config, 4)
    ctx = Distributed(torch.device("cpu"))
    state = TrainState()
    state.reset_sums(ctx.device)
    per_step: list[list[str]] = []
    with simulation:
        simulation.mark(*model.parameters(), *model.buffers(), state.running, state.epoch_sums)
        seen = [0]

        def on_step() -> None:
            per_step.append(simulation.syncs[seen[0]:])
            seen[0] = len(simulation.syncs)
            for group in optimizer.state.values():  # Adam's moments live on the device; its step count on the host
                simulation.mark(*(v for k, v in group.items() if k != "step"))

        train_one_epoch(model, model, loader, optimizer, scheduler, config, ctx, 1, state, on_step)
    return per_step


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_training_steps_read_the_device_only_when_logging(tmp_path, simulation: DeviceSimulation, decoder: str) -> None:
    per_step = steps_syncs(tmp_path, simulation, decoder)
    assert len(per_step) == 4
    assert per_step[0] == [] and per_step[2] == [], per_step  # ordinary steps: not one sync
    assert per_step[1] == ["tolist at state.py:" + per_step[1][0].rsplit(":", 1)[-1]]  # log steps: one read of the sums
    assert len(per_step[3]) == 1


@pytest.mark.parametrize("simulation", [True], indirect=True)
def test_lengths_on_the_device_would_cost_syncs(tmp_path, simulation: DeviceSimulation) -> None:
    """Caption lengths on the device cost a sync at every read: the LSTM forward reads them once
    (not at every decoder step) and the loss once more, still more than host lengths, which cost
    none."""
    per_step = steps_syncs(tmp_path, simulation, "lstm")
    in_decoder = [s for s in per_step[0] if s.split(" at ")[-1].startswith("lstm.py")]
    assert len(in_decoder) == 1 and in_decoder[0].startswith("tolist"), per_step[0]


def test_the_simulation_sees_the_reads_that_used_to_be_there(simulation: DeviceSimulation) -> None:
    """What the old step did (loss.item(), a boolean mask over the logits) is counted."""
    logits = torch.randn(3, 4, 5)
    targets = torch.tensor([[1, 2, 0, 0], [3, 1, 2, 0], [1, 1, 1, 1]])
    with simulation:
        simulation.mark(logits, targets)
        mask = targets != 0
        picked = logits[mask]  # (M, V): M is only known once the mask is read
        loss = torch.nn.functional.cross_entropy(picked, targets[mask])
        loss.item()
        float(loss)
        host = torch.tensor([3, 2, 1])
        int((host > 1).sum())  # a host tensor: no sync
    assert len(simulation.syncs) == 4, simulation.syncs  # two masks, item, float


class HostReward:
    """The mistake a step must not make: the reward brought to the host (`.cpu()`, a wait for
    the device) and sent back without blocking, so that nothing downstream sees it."""

    def __init__(self, reward: Callable[..., torch.Tensor]) -> None:
        self.reward = reward

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return self.reward(tokens, lengths, images).cpu().to(tokens.device, non_blocking=True)


def scst_steps_syncs(
    tmp_path, simulation: DeviceSimulation, decoder: str, baseline: str, on_host: bool = False, dropout: bool = True
) -> list[list[str]]:
    """Syncs per SCST step (the real CIDEr-D reward table, 5 samples per image) over 4 steps, the
    logged values read every 2nd step; with `on_host` the reward goes through `HostReward`."""
    from captioner.core.config_sections import ScstConfig
    from captioner.training.device_reward import DeviceReward
    from captioner.training.scst import SelfCritical

    config = tiny_config(f"model.decoder.type={decoder}", "train.log_every=2", "data.batch_size=2", "train.device=cpu")
    model = tiny_model(f"model.decoder.type={decoder}").train()
    dataset = CaptionDataset(fake_records(tmp_path, 8), model.vocab, ImageTransform(32, train=True), 20, "all")
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_captions)
    reward = DeviceReward(model.vocab, [r.captions for r in dataset.records])
    settings = ScstConfig(samples=5, baseline=baseline, max_length=8, dropout=dropout)
    objective = SelfCritical(settings, model.vocab, [r.captions for r in dataset.records],
                             HostReward(reward) if on_host else reward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = make_scheduler(optimizer, config, 4)
    ctx = Distributed(torch.device("cpu"))
    state = TrainState(logged=objective.logged)
    state.reset_sums(ctx.device)
    table = reward.on(torch.device("cpu"))
    per_step: list[list[str]] = []
    with simulation:
        simulation.mark(*model.parameters(), *model.buffers(), state.running, state.epoch_sums)
        # the table lives on the device
        simulation.mark(*(getattr(table, f) for f in table.__dataclass_fields__ if f != "meta"))
        seen = [0]

        def on_step() -> None:
            per_step.append(simulation.syncs[seen[0]:])
            seen[0] = len(simulation.syncs)
            for group in optimizer.state.values():
                simulation.mark(*(v for k, v in group.items() if k != "step"))

        train_one_epoch(model, model, loader, optimizer, scheduler, config, ctx, 1, state, on_step, objective)
    return per_step


@pytest.mark.parametrize("dropout", [True, False])
@pytest.mark.parametrize("baseline", ["greedy", "mean"])
@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_scst_steps_read_the_device_only_when_logging(tmp_path, simulation: DeviceSimulation, decoder: str,
                                                      baseline: str, dropout: bool) -> None:
    """Sampling, the greedy baseline, the CIDEr-D reward and the loss: not one device read on an
    ordinary step (the old step read the device every token and scored on the host), with the
    decoder's dropout on or off (the CPU's host-only paths, teacher-forced scoring and the
    shrinking roll-out, are not taken on a device)."""
    per_step = scst_steps_syncs(tmp_path, simulation, decoder, baseline, dropout=dropout)
    assert len(per_step) == 4
    assert per_step[0] == [] and per_step[2] == [], per_step
    # the log step's one read
    assert len(per_step[1]) == 1 and per_step[1][0].startswith("tolist at state.py:"), per_step[1]


def test_a_reward_copied_to_the_host_is_counted(tmp_path, simulation: DeviceSimulation) -> None:
    """A step that brings the reward to the host with `.cpu()` waits for the device there, even
    if the reward goes straight back: every ordinary step shows one read per reward call (the
    samples' and the greedy baseline's)."""
    per_step = scst_steps_syncs(tmp_path, simulation, "lstm", "greedy", on_host=True)
    assert len(per_step) == 4
    for step in (per_step[0], per_step[2]):
        assert len(step) == 2 and all(s.startswith("cpu at scst.py:") for s in step), per_step


def test_copies_to_the_host_are_counted(simulation: DeviceSimulation) -> None:
    """`.cpu()` of a device tensor is a read; of a host tensor it is nothing."""
    with simulation:
        loss = torch.randn(3)
        simulation.mark(loss)
        loss.sum().cpu()
        torch.tensor([1.0, 2.0]).cpu()
    assert simulation.syncs == ["cpu"]
