"""Host-device synchronisations per training step of the LSTM, counted on the CPU with the
simulated device of tests/test_sync.py, for the training loop of the checkout at ROOT.

    python benchmarks/count_step_syncs.py ROOT
    # an older commit: git archive COMMIT captioner | tar -x -C /tmp/old; python benchmarks/count_step_syncs.py /tmp/old

Captions of 9 to 20 words, batch 8, one caption per image: the old loop read the caption
lengths back at every decoder step, so its count grows with the longest caption.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

_parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]), help="the checkout whose loop is counted")
ROOT = str(Path(_parser.parse_args().root).resolve())
sys.path[:0] = [ROOT, str(Path(__file__).resolve().parents[1] / "tests")]

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import WORDS, tiny_config, tiny_model  # noqa: E402
from PIL import Image  # noqa: E402
from test_sync import DeviceSimulation  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import captioner  # noqa: E402
from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions  # noqa: E402
from captioner.data.images import ImageTransform  # noqa: E402
from captioner.data.records import ImageRecord  # noqa: E402



def training_loop() -> SimpleNamespace:
    """The loop's names in the layered package (captioner.training), or an older checkout's train.py."""
    try:
        from captioner.training.distributed import Distributed
        from captioner.training.loop import train_one_epoch
        from captioner.training.schedule import make_scheduler
        from captioner.training.state import TrainState
    except ImportError:
        import captioner.train as old

        return SimpleNamespace(**vars(old))
    return SimpleNamespace(Distributed=Distributed, train_one_epoch=train_one_epoch, make_scheduler=make_scheduler, TrainState=TrainState)


train = training_loop()
NEW_LOOP = hasattr(train, "Distributed")  # the loop of this branch; older ones moved lengths to the device


def main() -> None:
    assert captioner.__file__.startswith(ROOT), captioner.__file__
    torch.set_num_threads(1)
    sim = DeviceSimulation()
    patch = pytest.MonkeyPatch()
    for name in ("tolist", "numpy", "__array__"):
        original = getattr(torch.Tensor, name)

        def read(self, *args, _original=original, _name=name, **kwargs):
            if sim.tracked(self):
                sim.record(_name)
            return _original(self, *args, **kwargs)

        patch.setattr(torch.Tensor, name, read)
    moved = CaptionBatch.to

    def to_device(self, device, *args, **kwargs):
        batch = moved(self, device, *args, **kwargs)
        sim.mark(batch.images, batch.tokens, batch.image_rows)
        if not NEW_LOOP:
            sim.mark(batch.lengths)
        return batch

    patch.setattr(CaptionBatch, "to", to_device)

    folder = Path(tempfile.mkdtemp())
    records = []
    for i in range(16):
        path = folder / f"{i}.png"
        Image.new("RGB", (32, 32), (i * 9, 50, 90)).save(path)
        n = 9 + (i * 7) % 12  # 9..20 words
        records.append(ImageRecord(i, path, (" ".join(WORDS[j % len(WORDS)] for j in range(i, i + n)),)))
    config = tiny_config("train.log_every=1000", "train.device=cpu")
    model = tiny_model().train()
    dataset = CaptionDataset(records, model.vocab, ImageTransform(32, train=True), 30, "one")
    loader = DataLoader(dataset, batch_size=8, collate_fn=collate_captions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = train.make_scheduler(optimizer, config, 2)
    state = train.TrainState()
    counts: list[int] = []

    def on_step() -> None:
        counts.append(len(sim.syncs) - sum(counts))
        for moments in optimizer.state.values():  # Adam's moments on the device, its step count on the host
            sim.mark(*(v for k, v in moments.items() if k != "step"))

    with sim:
        sim.mark(*model.parameters(), *model.buffers())
        if NEW_LOOP:
            ctx = train.Distributed(torch.device("cpu"))
            state.reset_sums(ctx.device)
            sim.mark(state.running, state.epoch_sums)
            train.train_one_epoch(model, model, loader, optimizer, scheduler, config, ctx, 1, state, on_step)
        else:
            train.train_one_epoch(model, loader, optimizer, scheduler, config, torch.device("cpu"), 1, state, on_step)
    where = Counter(s.split(" at ")[0] + " at " + s.rsplit(" at ", 1)[-1] for s in sim.syncs[: counts[0]])
    print(f"{ROOT}: syncs per step {counts}; first step: {where.most_common(6)}")


if __name__ == "__main__":
    main()
