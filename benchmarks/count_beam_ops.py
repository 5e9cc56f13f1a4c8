"""Kernels per beam-search step for one image, ours beside the reference, counted on the CPU.

    python benchmarks/count_beam_ops.py [--root CHECKOUT] [--beam 3] [--steps 20] [--reference DIR_OR_GIT_DIR] [--device-path]
    # an older commit: git archive COMMIT captioner configs | tar -x -C /tmp/old; python benchmarks/count_beam_ops.py --root /tmp/old

One image at a time, a GPU's beam search is bound by kernel launches, not arithmetic (the H100
and H200 rows of docs/benchmarks.md): each op the dispatcher runs on a tensor is one launch
there, except views, which launch nothing. This script counts those ops per step with a
TorchDispatchMode, for the COCO configs' decoders (random weights, <eos> unreachable so every
run takes --steps steps, a 14x14 grid) and for the reference's beam search
(sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning, benchmarks/reference_sat.py), with the CPU's
ms per step beside them. The counts are the measurement; the CPU's times are not the GPU's.

On the CPU our search takes its CPU path (it stops stepping finished images, and the attention
works in cache-sized blocks). --device-path counts the path a GPU takes instead: our model on the
tests' fake CUDA tensors (tests/cuda_semantics.py, with values and CUDA's bf16 autocast), so every
device check answers "cuda". Its ms are the emulation's and are not printed.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

_parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the checkout whose beam search is counted")
_parser.add_argument("--beam", type=int, default=3)
_parser.add_argument("--steps", type=int, default=20, help="words per caption (every run takes all of them)")
_parser.add_argument("--reference", help="reference checkout or git dir (default: $CAPTIONER_REFERENCE or the mirror)")
_parser.add_argument("--top", type=int, default=8, help="how many of the most frequent ops to name per row")
_parser.add_argument("--device-path", action="store_true", help="count our search as a GPU runs it (fake CUDA tensors)")
ARGS = _parser.parse_args()
sys.path[:0] = [str(Path(ARGS.root).resolve()), str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests")]

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import reference_sat  # noqa: E402
from bench_gpu import eos_unreachable, synthetic_records  # noqa: E402
from captioner.core.config import load_config  # noqa: E402
from captioner.models.build import build_model  # noqa: E402
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search  # noqa: E402

CONFIGS = ("coco_lstm_resnet101", "coco_transformer_resnet101")
# Ops that only re-describe memory: no kernel on a GPU.
# (prim.device: fake tensors answer `.device` through the dispatcher; a real tensor launches nothing.)
VIEWS = frozenset({
    "device", "view", "_unsafe_view", "as_strided", "detach", "alias", "slice", "select", "unsqueeze", "squeeze", "expand",
    "transpose", "t", "permute", "reshape", "_reshape_alias", "flatten", "split", "split_with_sizes", "unbind",
    "chunk", "lift_fresh",
})


class CountOps(TorchDispatchMode):
    """Counts every op dispatched on a tensor while active, views apart."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def measure(run, steps: int, timed: bool = True) -> tuple[float, float, Counter[str]]:  # noqa: ANN001
    """-> kernels per step, CPU ms per step (the mean of 3 runs after a warm-up; nan if not timed), the op counts."""
    with torch.no_grad():
        run()
        counter = CountOps()
        with counter:
            run()
        seconds = float("nan")
        if timed:
            start = time.perf_counter()
            for _ in range(3):
                run()
            seconds = (time.perf_counter() - start) / 3
    return sum(counter.kernels.values()) / steps, 1000 * seconds / steps, counter.kernels


def on_fake_cuda(model, feats: torch.Tensor, special, options) -> tuple[float, float, Counter[str]]:  # noqa: ANN001
    """measure() of our search on fake CUDA tensors: the GPU's path, untimed (the emulation's time means nothing)."""
    from cuda_semantics import fake_cuda, to_fake_cuda

    with fake_cuda(values=True) as mode:
        to_fake_cuda(model, mode)
        device_feats = feats.to("cuda", non_blocking=True)  # (1, N, D)
        return measure(lambda: beam_search(model.decoder, device_feats, special, options), ARGS.steps, timed=False)


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    _, vocab = synthetic_records([Path(f"{i}.jpg") for i in range(1)], 10_000)
    root = Path(ARGS.root).resolve()
    rows = []
    for name in CONFIGS:
        config = load_config(root / "configs" / f"{name}.yaml", [])
        model = build_model(config, vocab, load_pretrained=False).eval()
        eos_unreachable(model)
        options = DecodeOptions.from_config(config.decode, beam_size=ARGS.beam, max_length=ARGS.steps)
        feats = torch.randn(1, 196, model.encoder.out_dim)  # (1, N, D): one image's 14x14 grid
        special = SpecialTokens.of(vocab)
        if ARGS.device_path:
            rows.append((f"ours, {name}, device path", *on_fake_cuda(model, feats, special, options)))
        else:
            rows.append((f"ours, {name}", *measure(lambda: beam_search(model.decoder, feats, special, options), ARGS.steps)))
    try:
        ref = reference_sat.load_reference(ARGS.reference, torch.device("cpu"))
    except reference_sat.ReferenceUnavailable as e:
        print(f"reference not available, ours only: {e}")
    else:
        decoder = reference_sat.make_decoder(ref, len(vocab), 2048, torch.device("cpu"), 512).eval()
        with torch.no_grad():
            decoder.fc.bias[vocab.eos_id] = -1e4
        grid = torch.randn(1, 14, 14, 2048)
        search = lambda: reference_sat.beam_search_one(decoder, grid, vocab.bos_id, vocab.eos_id, ARGS.beam, ARGS.steps - 1)  # noqa: E731
        rows.append(("reference, its caption.py", *measure(search, ARGS.steps)))
    print(f"one image, beam {ARGS.beam}, {ARGS.steps} steps, torch {torch.__version__}, {root}")
    print("| beam search | kernels per step | CPU ms per step | most frequent |\n|---|---:|---:|---|")
    for who, kernels, ms, counts in rows:
        common = ", ".join(f"{op} {n / ARGS.steps:.1f}" for op, n in counts.most_common(ARGS.top))
        print(f"| {who} | {kernels:.1f} | {'-' if math.isnan(ms) else f'{ms:.2f}'} | {common} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
