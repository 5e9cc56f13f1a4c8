"""The GPU benchmark: training and beam search throughput of the COCO configs beside the reference.

    python -m benchmarks gpu --device cpu --tiny      # smoke test of the code paths, NOT a measurement

bf16 autocast, random ResNet-101 weights, synthetic 640x480 JPEGs through the real loader: training,
the SCST step (no host sync allowed), the decoder step eager / compiled / CUDA graphs and beam search,
each row written to --out as it is measured ("complete": false until the last)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import reference_sat  # noqa: E402
from benchmarks import timing  # noqa: E402

from captioner.apps.arguments import nonnegative_int, positive_int, whole_number  # noqa: E402
from captioner.core.config import load_config  # noqa: E402
from captioner.core.errors import CaptionerError  # noqa: E402
from captioner.core.config_sections import Config  # noqa: E402
from captioner.core.files import folder_problem, write_atomically  # noqa: E402
from captioner.core.process_settings import loader_workers  # noqa: E402
from captioner.data.batching import (PREPROCESS_CHOICES, CaptionBatch, CaptionDataset, collate_captions,  # noqa: E402
                                      device_preprocess)
from captioner.data.image_transform import ImageTransform, normalize_images  # noqa: E402
from captioner.data.records import ImageRecord  # noqa: E402
from captioner.models.captioner import Captioner  # noqa: E402
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search  # noqa: E402
from captioner.models.decoder import use_graphed_step  # noqa: E402
from captioner.text.vocab import SPECIALS, Vocabulary  # noqa: E402
from captioner.training.loop import caption_loss  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("coco_lstm_resnet101", "coco_transformer_resnet101")
KARPATHY_TRAIN_IMAGES = 113_287
PARTS = ("training", "scst", "step", "beam", "graphs", "reference")  # graphs: beam rows with decode.cuda_graphs
CPU_NOTE = "--device cpu --tiny: a smoke test of the code paths on tiny inputs, NOT a GPU measurement"


class Usage(Exception):
    """A one-line reason to stop before measuring anything."""


# --- inputs ------------------------------------------------------------------------------------


def write_jpegs(folder: Path, count: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """COCO-sized JPEGs: smooth random colour fields plus noise (about COCO's file size at 640x480)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (size[1] // 32, size[0] // 32, 3), dtype=np.uint8))
        pixels = np.asarray(coarse.resize(size, Image.BICUBIC), dtype=np.int16)  # (H, W, 3)
        pixels = np.clip(pixels + rng.integers(-20, 21, pixels.shape), 0, 255).astype(np.uint8)
        path = folder / f"synthetic_{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def synthetic_records(paths: list[Path], vocab_size: int, seed: int = 0) -> tuple[list[ImageRecord], Vocabulary]:
    """Five captions of 8-16 words per image over a vocabulary of `vocab_size` words (Zipf-like)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    records = []
    for i, path in enumerate(paths):
        captions = tuple(" ".join(rng.choice(words, size=int(rng.integers(8, 17)), p=weights)) for _ in range(5))
        records.append(ImageRecord(i, path, captions))
    return records, Vocabulary([*SPECIALS, *words])


def forever(loader: DataLoader) -> Iterator[CaptionBatch]:
    while True:
        for batch in loader:
            if batch is not None:
                yield batch


# --- measurement -------------------------------------------------------------------------------


class Utilisation:
    """Mean GPU utilisation (%) sampled every 50 ms by pynvml while the block runs; None without it."""

    def __init__(self, device: torch.device) -> None:
        self.handle = None
        self.samples: list[int] = []
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception:  # no pynvml, or no NVML on the host: utilisation is not reported
                self.handle = None

    def __enter__(self) -> Utilisation:
        self.stop = threading.Event()
        if self.handle is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.handle is not None:
            self.thread.join()

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None


def measure(step: Callable[[], tuple[int, int]], warmup: int, steps: int, device: torch.device) -> dict:
    """Run `step` (-> captions, images) warmup + steps times; rates over the last `steps`."""
    for _ in range(warmup):
        step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    captions = images = 0
    with Utilisation(device) as util:
        start = time.perf_counter()
        for _ in range(steps):
            c, i = step()
            captions += c
            images += i
        sync(device)
        seconds = time.perf_counter() - start
    return {
        "seconds_per_step": seconds / steps,
        "captions_per_s": captions / seconds,
        "images_per_s": images / seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "gpu_utilisation_percent": util.mean,
        "coco_epoch_hours": KARPATHY_TRAIN_IMAGES / (images / seconds) / 3600,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def optimizer_for(model: Captioner, config: Config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with train.py's two groups (decoder at lr, fine-tuned encoder at encoder_lr)."""
    groups = [{"params": list(model.decoder.parameters()), "lr": config.train.lr}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params:
        groups.append({"params": encoder_params, "lr": config.train.encoder_lr})
    return torch.optim.AdamW(groups, weight_decay=config.train.weight_decay)


# What a training row feeds the model: JPEGs through the fine-tuned encoder, or the frozen encoder's
# grids, read from host memory or (data.features_on_device) held on the device.
GRIDS = {"images": "fine-tuned", "host": "frozen, cached grids", "device": "frozen, grids on the device"}


def our_training(
    config: Config, records: list[ImageRecord], vocab: Vocabulary, device: torch.device, grids: str, warmup: int,
    steps: int
) -> dict:
    """train.py's step (caption_loss, backward, clipping, AdamW) on batches from the real loader;
    `grids` (a key of GRIDS): "host" is train.py's cached-feature path, "device" the same with
    data.features_on_device (the rows indexed on the device, no workers, nothing pinned)."""
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).to(device)  # random ResNet weights, same cost
    data = config.data
    frozen, on_device = grids != "images", grids == "device"
    features = None
    if frozen:
        model.encoder.freeze()
        shape = (len(records), model.encoder.config.grid_size**2 or 196, model.encoder.out_dim)
        features = torch.randn(shape).to(
            torch.bfloat16 if device.type == "cuda" else torch.float32)  # (n, N, D)
        if on_device:
            features = features.to(device)
    transform = ImageTransform(data.image_size, train=True, augment=data.augment)
    dataset = CaptionDataset(
        records, vocab, transform, data.max_caption_length, data.captions_per_image, features,
        device_preprocess(data.device_preprocess, device),  # the GPU crops, jitters (and decodes)
    )
    workers = 0 if frozen else loader_workers(data.num_workers)  # -1: this process's share of the cores
    loader = DataLoader(
        dataset, batch_size=data.batch_size, shuffle=True, num_workers=workers, collate_fn=collate_captions,
        drop_last=True, pin_memory=device.type == "cuda" and not on_device, persistent_workers=workers > 0,
    )
    batches = forever(loader)
    optimizer = optimizer_for(model, config, device)
    model.train()

    def step() -> tuple[int, int]:
        batch = next(batches).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, _ = caption_loss(model, batch, config, encoded=frozen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        return batch.tokens.shape[0], batch.images.shape[0]

    return measure(step, warmup, steps, device)


def reference_training(
    ref, config: Config, records: list[ImageRecord], vocab: Vocabulary, device: torch.device, frozen: bool,
    warmup: int, steps: int, width: int
) -> dict:
    """Its train.py step: one caption per image (its dataset's items), fp32 as its code runs,
    Adam at its rates; with its encoder fine-tuned on the same JPEG pipeline, or on cached grids."""
    torch.manual_seed(0)
    data = config.data
    decoder = reference_sat.make_decoder(ref, len(vocab), 2048, device, width)
    params = [p for p in decoder.parameters() if p.requires_grad]
    encoder = None
    if frozen:
        grids = torch.randn(len(records), 14, 14, 2048)  # (n, g, g, D)
    else:
        encoder = reference_sat.make_encoder(ref, device)
    transform = ImageTransform(data.image_size, train=True, augment=data.augment)
    dataset = CaptionDataset(records, vocab, transform, data.max_caption_length, "one", grids if frozen else None)
    workers = 0 if frozen else loader_workers(data.num_workers)  # -1: this process's share of the cores
    loader = DataLoader(
        dataset, batch_size=data.batch_size, shuffle=True, num_workers=workers, collate_fn=collate_captions,
        drop_last=True, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
    )
    batches = forever(loader)
    optimizer = torch.optim.Adam(params, lr=4e-4)
    encoder_optimizer = None
    if encoder is not None:
        encoder_optimizer = torch.optim.Adam([p for p in encoder.parameters() if p.requires_grad], lr=1e-4)

    def step() -> tuple[int, int]:
        batch = next(batches).to(device)
        if encoder is not None:
            encoder.train()
            encoder_optimizer.zero_grad()
            grid = encoder(normalize_images(batch.images))  # (B, 14, 14, D): from normalised floats, as its own
        else:
            grid = batch.images
        reference_sat.train_step(decoder, optimizer, grid, batch.tokens, batch.lengths[:, None])
        if encoder_optimizer is not None:  # its train.py: clamp, then step the encoder too
            for p in encoder.parameters():
                if p.grad is not None:
                    p.grad.data.clamp_(-5.0, 5.0)
            encoder_optimizer.step()
        return batch.tokens.shape[0], batch.images.shape[0]

    return measure(step, warmup, steps, device)


def our_scst(
    config: Config, records: list[ImageRecord], vocab: Vocabulary, device: torch.device, baseline: str, warmup: int,
    steps: int, cache_dir: Path,
) -> dict:
    """The SCST step (scst.SelfCritical, backward, AdamW) on cached grids, as fit runs it. On CUDA,
    `steps` steps first run under set_sync_debug_mode("error"), so a row proves no step makes the host
    wait for the GPU; then the same number is timed."""
    from captioner.training.scst import SelfCritical

    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).to(device)
    model.encoder.freeze()  # the store's rows are the whole encoder's output
    settings = replace(config.scst, baseline=baseline)
    objective = SelfCritical(settings, vocab, [r.captions for r in records], cache_dir=cache_dir)
    optimizer = torch.optim.AdamW(model.decoder.parameters(), lr=config.train.lr)
    B, N = config.data.batch_size, model.encoder.config.grid_size**2 or 196
    feats = torch.randn(len(records), N, model.encoder.out_dim).half()  # (n, N, D): the store's fp16 rows
    batches = [
        CaptionBatch(feats[i : i + B], torch.zeros(B, 2, dtype=torch.long), torch.full((B,), 2), torch.arange(B),
                     torch.arange(i, i + B))
        for i in range(0, len(records) - B + 1, B)
    ]
    if device.type == "cuda":  # as the DataLoader pins them: the copies never wait on pageable memory
        batches = [b.pin_memory() for b in batches]
    count = iter(range(10**9))

    def step() -> tuple[int, int]:
        batch = batches[next(count) % len(batches)].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, _ = objective(model, batch, config, encoded=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return B * settings.samples, B

    for _ in range(warmup):  # the first step also copies the reward's table to the device
        step()
    if device.type == "cuda":  # then steps with no synchronisation allowed: any would raise
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    row = measure(step, 0, steps, device)
    return {**row, "baseline": baseline, "samples": settings.samples, "sync_checked": device.type == "cuda"}


def our_compiled_step(config: Config, vocab: Vocabulary, device: torch.device, rows: int,
                      repeats: int) -> Iterator[dict]:
    """ms per decoder step for `rows` beams, eager, compiled and (CUDA) CUDA graphs, whose replay
    overwrites the last one's outputs, so the state fed back is cloned (and timed). A failing mode
    gives a row with its error. On the CPU the compiled step runs through aot_eager, not Inductor."""
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).to(device).eval()
    decoder, length, grid = model.decoder, config.decode.max_length, model.encoder.config.grid_size
    feats = torch.randn(rows, grid**2 or 196, model.encoder.out_dim, device=device)  # (R, N, D)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    modes = {"eager": decoder.step, "compiled": torch.compile(decoder.step, fullgraph=True, backend=backend)}
    if device.type == "cuda":
        modes["compiled, CUDA graphs"] = torch.compile(decoder.step, fullgraph=True, mode="reduce-overhead")
    for name, step in modes.items():
        graphs = name.endswith("CUDA graphs")

        @torch.no_grad()
        def caption() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                memory = decoder.prepare(feats)
                state = decoder.init_state(memory, capacity=length)
                prev = torch.full((rows,), vocab.bos_id, device=device)
                for _ in range(length):
                    if graphs:
                        torch.compiler.cudagraph_mark_step_begin()
                    logprobs, _, state = step(memory, prev, state)
                    if graphs:  # the next replay overwrites this one's outputs
                        state = {key: value.clone() for key, value in state.items()}
                    prev = logprobs.argmax(dim=-1)  # (R,)

        try:
            start = time.perf_counter()
            caption()  # compiles
            sync(device)
            first = time.perf_counter() - start
            seconds = median_seconds(caption, repeats, device)
        except Exception as e:  # one mode failing (a CUDA graph capture, say) leaves the others' rows
            yield {"step": name, "rows": rows, "ms_per_step": None, "first_caption_s": None,
                   "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            continue
        yield {"step": name, "rows": rows, "ms_per_step": 1000 * seconds / length, "first_caption_s": first}


def eos_unreachable(model: Captioner) -> None:
    """Every beam run decodes max_length steps: equal work whatever the random weights say."""
    out = model.decoder.out_vocab if hasattr(model.decoder, "out_vocab") else model.decoder.out
    with torch.no_grad():
        out.bias[model.vocab.eos_id] = -1e4


def our_beam(
    config: Config, vocab: Vocabulary, device: torch.device, batches: list[int], beams: list[int], repeats: int,
    grid: int, graphs_too: bool
) -> Iterator[dict]:
    """Beam search images/s per (beam, batch), eager; then on CUDA the same with the decoder step
    replayed as a CUDA graph (decode.cuda_graphs), with the share of images whose caption is the
    eager one's (bf16 kernels fused differently can flip a near tie)."""
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).to(device).eval()
    eos_unreachable(model)
    special = SpecialTokens(vocab.bos_id, vocab.eos_id)
    inputs = {B: torch.randn(B, grid, model.encoder.out_dim, device=device) for B in batches}  # grids (B, N, D)
    eager_tokens: dict[tuple[int, int], list[list[int]]] = {}
    for graphs in (False, True) if device.type == "cuda" and graphs_too else (False,):
        if graphs:
            use_graphed_step(model.decoder)
        for K in beams:
            for B in batches:
                feats, options = inputs[B], DecodeOptions(beam_size=K, max_length=config.decode.max_length)
                found: list[list[int]] = []

                def run() -> None:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                        found[:] = [h.tokens for h in beam_search(model.decoder, feats, special, options)]

                print(f"{time.strftime('%H:%M:%S')} beam {K}, batch {B}, {'CUDA graph' if graphs else 'eager'}: "
                      "measuring", flush=True)
                first: list[float] = []
                seconds = median_seconds(run, repeats, device, first)
                # first_call_s: the first search at a new size compiles and captures the graph
                row = {"beam": K, "batch": B, "images_per_s": B / seconds, "steps": config.decode.max_length,
                       "cuda_graphs": graphs, "first_call_s": first[0]}
                if graphs:
                    row["same_as_eager"] = sum(a == b for a, b in zip(found, eager_tokens[K, B])) / B
                else:
                    eager_tokens[K, B] = list(found)
                yield row


def reference_beam(ref, vocab: Vocabulary, device: torch.device, beams: list[int], images: int, steps: int,
                   width: int) -> list[dict]:
    torch.manual_seed(0)
    decoder = reference_sat.make_decoder(ref, len(vocab), 2048, device, width).eval()
    with torch.no_grad():
        decoder.fc.bias[vocab.eos_id] = -1e4
    grids = torch.randn(images, 1, 14, 14, 2048, device=device)
    rows = []
    for K in beams:

        def run() -> None:
            for grid in grids:
                reference_sat.beam_search_one(decoder, grid, vocab.bos_id, vocab.eos_id, beam_size=K,
                                              max_steps=steps - 1)

        seconds = median_seconds(run, 1, device)
        rows.append({"beam": K, "batch": 1, "images_per_s": images / seconds, "steps": steps})
    return rows


def median_seconds(fn: Callable[[], None], repeats: int, device: torch.device,
                   first: list[float] | None = None) -> float:
    """The median of `repeats` timed calls after one warm-up call, whose seconds are appended to
    `first` when given. Each call is timed to the device's end of its work."""
    def synced() -> None:
        fn()
        sync(device)

    sync(device)
    start = time.perf_counter()
    synced()
    if first is not None:
        first.append(time.perf_counter() - start)
    return timing.measure(synced, repeats, warmup=0).median


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = timing.argument_parser("gpu", __doc__)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (only with --tiny)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny inputs and few steps: exercises the code, measures nothing")
    parser.add_argument("--steps", type=positive_int, default=30, help="measured training steps per row")
    parser.add_argument("--warmup", type=nonnegative_int, default=5)
    parser.add_argument("--vocab", type=functools.partial(whole_number, minimum=len(SPECIALS) + 1), default=10_000)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--reference",
                        help="reference checkout or git dir (default: $CAPTIONER_REFERENCE or the mirror)")
    parser.add_argument("--reference-beam-images", type=positive_int, default=8)
    parser.add_argument("--device-preprocess", default="none", choices=PREPROCESS_CHOICES,
                        help="data.device_preprocess of our training rows (docs/input_pipeline.md)")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                        help="what to measure (default: all); "
                             "e.g. --parts training for a --device-preprocess comparison")
    parser.add_argument("--out", default="runs/bench_gpu.json")
    return parser.parse_args(argv)


def check_device(args: argparse.Namespace) -> torch.device:
    """--device as a torch device this run can measure on, and --out a file it can write; else Usage, in one line."""
    out = Path(args.out)
    problem = "a folder" if out.is_dir() else folder_problem(out.parent)
    if problem:
        raise Usage(f"bench_gpu: --out {args.out}: {problem}; give the JSON file the rows go to")
    try:
        device = measured_device(args.device)
    except CaptionerError as e:
        raise Usage(f"bench_gpu: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Usage("bench_gpu: no CUDA GPU is available; this benchmark measures a GPU "
                    "(`--device cpu --tiny` only smoke-tests its code)")
    if device.type == "cpu" and not args.tiny:
        raise Usage("bench_gpu: --device cpu runs only with --tiny "
                    "(a smoke test; the CPU's benchmarks are in python -m benchmarks --list)")
    return device


def measured_device(name: str) -> torch.device:
    """--device of a GPU benchmark: cuda, cuda:N, or cpu to rehearse it; another name (meta, mps, a typo) is one
    CaptionerError. Whether a CUDA GPU is there is the caller's to say."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        raise CaptionerError(f"--device {name!r}: expected cuda, cuda:N or cpu")
    return device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device = check_device(args)
    except Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    timing.print_environment(args)
    if args.tiny:
        print(CPU_NOTE if device.type == "cpu" else "--tiny: tiny inputs, NOT a measurement")
        overrides = ["data.image_size=64", "data.batch_size=2", "data.num_workers=0", "decode.max_length=3",
                     "model.encoder.name=resnet50"]  # the same paths and widths as ResNet-101, half its work
        warmup, steps, vocab_size, batches, beams, width, image_size = 1, 1, 50, [1, 2], [3], 32, (96, 72)
        overrides += ["model.decoder.embed_dim=32", "model.decoder.hidden_dim=32", "model.decoder.attention_dim=32"]
        overrides += ["model.decoder.d_model=32", "model.decoder.ff_dim=64", "model.decoder.num_heads=2",
                      "model.decoder.num_layers=1"]
        ref_images = 1
    else:
        overrides, warmup, steps, vocab_size = [], args.warmup, args.steps, args.vocab
        batches, beams, width, image_size, ref_images = ([1, 64, 256], [3, 5], 512, (640, 480),
                                                         args.reference_beam_images)
    overrides.append(f"data.device_preprocess={args.device_preprocess}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    try:
        ref = reference_sat.load_reference(args.reference, device)
    except reference_sat.ReferenceUnavailable as e:
        ref = None
        print(f"reference not available, ours only: {e}")

    results: dict = {
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else "cpu (smoke test, not a measurement)"),
        "torch": torch.__version__,
        "tiny": args.tiny,
        "device_preprocess": args.device_preprocess,
        "training": [],
        "scst": [],
        "step": [],
        "beam": [],
        "complete": False,  # True once every requested row is measured
    }
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as folder:
        configs = {name: load_config(ROOT / "configs" / f"{name}.yaml", overrides) for name in CONFIGS}
        batch = max(c.data.batch_size for c in configs.values())
        paths = write_jpegs(Path(folder), batch * (warmup + steps + 1), image_size)
        records, vocab = synthetic_records(paths, vocab_size)
        for name in args.configs:
            config = configs[name]
            if "training" in args.parts:
                for grids, encoder in GRIDS.items():
                    row = our_training(config, records, vocab, device, grids, warmup, steps)
                    record(results, "training", {"who": "ours", "config": name, "encoder": encoder, **row}, out)
            if "scst" in args.parts:
                for baseline in ("greedy", "mean"):
                    record(results, "scst", {"config": name, **our_scst(config, records, vocab, device, baseline,
                                                                         warmup, steps, Path(folder))}, out)
            if "step" in args.parts:
                for row in our_compiled_step(config, vocab, device, 3 * batches[-1] // 4 or 3, 3):
                    record(results, "step", {"config": name, **row}, out)
            if "beam" in args.parts or "graphs" in args.parts:  # the graphs' rows are compared with eager ones
                for row in our_beam(config, vocab, device, batches, beams, 3, 196, "graphs" in args.parts):
                    record(results, "beam", {"who": "ours", "config": name, **row}, out)
        if ref is not None and "reference" in args.parts:
            lstm = configs[CONFIGS[0]]
            for frozen in (False, True):
                row = reference_training(ref, lstm, records, vocab, device, frozen, warmup, steps, width)
                record(results, "training", {"who": "reference", "config": "its train.py",
                                             "encoder": GRIDS["host" if frozen else "images"], **row}, out)
            for row in reference_beam(ref, vocab, device, beams, ref_images, lstm.decode.max_length, width):
                record(results, "beam", {"who": "reference", "config": "its caption.py", **row}, out)
    results["complete"] = True
    write(results, out)
    print_table(results)
    print(f"wrote {out}")
    return 0


def record(results: dict, section: str, row: dict, out: Path) -> None:
    """Keep a measured row, print it at once and rewrite --out: a run stopped by a time limit
    (a GPU lent for minutes) keeps every row it finished."""
    results[section].append(row)
    print(f"{time.strftime('%H:%M:%S')} {section}: {json.dumps(row)}", flush=True)
    write(results, out)


def write(results: dict, out: Path) -> None:
    """The rows so far as --out, written whole: a run stopped meanwhile leaves the previous version."""
    write_atomically(out, lambda tmp: tmp.write_text(json.dumps(results, indent=1)))


def print_table(results: dict) -> None:
    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    print(f"\n{results['device']}, torch {results['torch']}")
    print("| who | config | encoder | captions/s | images/s | peak GiB | GPU util % | COCO epoch (h) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results["training"]:
        print(
            f"| {r['who']} | {r['config']} | {r['encoder']} | {r['captions_per_s']:.1f} | {r['images_per_s']:.1f} | "
            f"{fmt(r['peak_memory_gib'], '.1f')} | {fmt(r['gpu_utilisation_percent'], '.0f')} | "
            f"{r['coco_epoch_hours']:.2f} |"
        )
    print("\n| SCST | baseline | samples | captions/s | images/s | peak GiB | GPU util % | syncs checked |"
          "\n|---|---|---:|---:|---:|---:|---:|---|")
    for r in results["scst"]:
        print(
            f"| {r['config']} | {r['baseline']} | {r['samples']} | {r['captions_per_s']:.1f} | "
            f"{r['images_per_s']:.1f} | {fmt(r['peak_memory_gib'], '.1f')} | "
            f"{fmt(r['gpu_utilisation_percent'], '.0f')} | "
            f"{'none (set_sync_debug_mode error)' if r['sync_checked'] else 'not on this device'} |"
        )
    print("\n| decoder step | config | rows | ms/step | first caption s (compile) |\n|---|---|---:|---:|---:|")
    for r in results["step"]:
        if r.get("error"):
            print(f"| {r['step']} | {r['config']} | {r['rows']} | failed: {r['error']} | |")
        else:
            print(f"| {r['step']} | {r['config']} | {r['rows']} | {r['ms_per_step']:.2f} | "
                  f"{r['first_caption_s']:.1f} |")
    print("\n| who | config | step | beam | batch | steps | images/s | captions as eager |"
          "\n|---|---|---|---:|---:|---:|---:|---:|")
    for r in results["beam"]:
        graphs = "CUDA graph" if r.get("cuda_graphs") else "eager"
        same = f"{100 * r['same_as_eager']:.0f}%" if "same_as_eager" in r else ""
        print(f"| {r['who']} | {r['config']} | {graphs} | {r['beam']} | {r['batch']} | {r['steps']} | "
              f"{r['images_per_s']:.1f} | {same} |")


if __name__ == "__main__":
    sys.exit(timing.run_main(main))
