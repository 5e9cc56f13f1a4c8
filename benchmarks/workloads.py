"""The work the speed benchmarks time, built once here so that `reference` and `roofline` time the
same thing: the training step as `training.loop` runs it (caption_loss, backward, clipping, fused
AdamW), beam search through `Captioner.decode`, and the packaged model's encoder pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from captioner.core.config import Config, load_config
from captioner.core.config_sections import DataConfig
from captioner.data.batching import CaptionBatch
from captioner.data.shapes import sample_scene, write_captions
from captioner.models.captioner import Captioner
from captioner.models.model_paths import packaged_models
from captioner.text.vocab import SPECIALS, Vocabulary
from captioner.training.loop import caption_loss, clip_gradients
from captioner.training.run_setup import make_optimizer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# The tutorial's sizes: a ResNet-101 grid of 14x14x2048, 10,000 words, 32 captions of 20 words a step.
GRID, FEAT_DIM, VOCAB, BATCH, WORDS = (14, 14), 2048, 10_000, 32, 20
BEAM, BEAM_STEPS = 3, 51  # the tutorial's beam 3, its loop stopping after step 51


@dataclass
class Workload:
    """One timed action with what it is, the model it runs and the action itself (no arguments)."""

    name: str
    about: str
    model: Captioner
    run: Callable[[], object]


def words(size: int) -> Vocabulary:
    """A vocabulary of `size` entries, the special tokens first."""
    return Vocabulary([*SPECIALS, *(f"w{i}" for i in range(size - len(SPECIALS)))])


def build(config: Config, vocab: Vocabulary, seed: int = 0) -> Captioner:
    """The config's model with random weights (nothing is downloaded), seeded."""
    torch.manual_seed(seed)
    return Captioner.from_config(config, vocab, load_pretrained=False)


def coco_config(decoder: str) -> Config:
    """The COCO config's decoder over a frozen encoder: the decoder alone trains, on stored features."""
    config = load_config(CONFIGS / f"coco_{decoder}_resnet101.yaml")
    encoder = replace(config.model.encoder, fine_tune_blocks=0)
    return replace(config, model=replace(config.model, encoder=encoder))


def stored_batch(images: int, captions_each: int, tokens: int, vocab: Vocabulary, seed: int = 0) -> CaptionBatch:
    """Stored features (images, 196, 2048) fp16 as the feature store keeps them, each image with
    `captions_each` captions of `tokens` tokens (<bos>, words, <eos>), all of one length."""
    generator = torch.Generator().manual_seed(seed)
    feats = torch.randn(images, GRID[0] * GRID[1], FEAT_DIM, generator=generator).half()  # (B, N, D)
    return caption_rows(feats, captions_each, tokens, vocab, generator)


def caption_rows(images: torch.Tensor, captions_each: int, tokens: int | list[int], vocab: Vocabulary,
                 generator: torch.Generator) -> CaptionBatch:
    """A batch of `images` (features or pixels) with random captions of `tokens` tokens each (a list:
    the captions' lengths in turn), padded and ordered longest first as `collate_captions` does."""
    B, C = images.shape[0], images.shape[0] * captions_each
    lengths = torch.tensor([tokens] * C if isinstance(tokens, int) else [tokens[i % len(tokens)] for i in range(C)])
    lengths, order = lengths.sort(descending=True, stable=True)  # (C,)
    caption = torch.randint(len(SPECIALS), len(vocab), (C, int(lengths[0])), generator=generator)  # (C, T)
    caption[:, 0] = vocab.bos_id
    caption[torch.arange(C), lengths - 1] = vocab.eos_id
    caption[torch.arange(caption.shape[1])[None, :] >= lengths[:, None]] = vocab.pad_id  # after each <eos>
    if captions_each == 1:  # the images take their captions' order: caption c describes image c
        return CaptionBatch(images[order], caption, lengths, None, order)
    return CaptionBatch(images, caption, lengths, order // captions_each, torch.arange(B))  # rows (C,): the images


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: Config, batch: CaptionBatch,
                  bf16: bool = False, encoded: bool = False, grad_clip: float = 0.0) -> float:
    """One training step as the loop takes it (loss, backward, gradient clipping where `grad_clip` > 0,
    optimiser) from images, or from stored grids when `encoded`, optionally under CPU bf16 autocast;
    returns the loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, _ = caption_loss(model, batch, config, encoded=encoded)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        clip_gradients(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach())


def train_step(model: Captioner, config: Config, batch: CaptionBatch, encoded: bool) -> Callable[[], object]:
    """One step of `training.loop.train_one_epoch` in fp32: loss, backward, gradient clipping, AdamW."""
    optimizer = make_optimizer(model, config, 1.0)
    model.train()
    return lambda: training_step(model, optimizer, config, batch, encoded=encoded, grad_clip=config.train.grad_clip)


def never_ends(model: Captioner) -> None:
    """<eos> made unreachable, so every beam search runs all its steps (as the reference's is made to)."""
    with torch.no_grad():
        model.decoder.out_vocab.bias[model.vocab.eos_id] = -1e4  # (V,) bias of the output layer


def beam_search(model: Captioner, images: int, steps: int = BEAM_STEPS, seed: int = 1) -> Callable[[], object]:
    """Beam 3 over `images` images' stored grids at once, `steps` words each (<eos> unreachable)."""
    feats = torch.randn(images, GRID[0] * GRID[1], FEAT_DIM, generator=torch.Generator().manual_seed(seed))
    model.eval()
    never_ends(model)
    return lambda: model.decode(feats, GRID, beam_size=BEAM, max_length=steps)  # (B, N, D) -> B captions


def decoder_train(decoder: str) -> Workload:
    """The COCO config's `decoder` trained on the tutorial's batch of stored features."""
    config = coco_config(decoder)
    model = build(config, words(VOCAB))
    batch = stored_batch(BATCH, 1, WORDS + 1, model.vocab)
    about = f"{'LSTM' if decoder == 'lstm' else decoder} train step: {BATCH} captions x {WORDS} words, " \
        "14x14x2048, vocab 10k"
    return Workload(f"{decoder}_train", about, model, train_step(model, config, batch, encoded=True))


def lstm_train() -> Workload:
    return decoder_train("lstm")


def transformer_train() -> Workload:
    return decoder_train("transformer")


def lstm_beam(images: int = BATCH, steps: int = BEAM_STEPS) -> Workload:
    model = build(coco_config("lstm"), words(VOCAB))
    return Workload("lstm_beam", f"LSTM beam {BEAM}: {images} images at once, {steps} steps",
                    model, beam_search(model, images, steps))


def packaged_encoder(images: int = 8) -> Workload:
    """The packaged model's encoder over `images` photographs' pixels, as captioning runs it."""
    model = Captioner.from_pretrained(packaged_models()[0], device="cpu").eval()
    size = model.spec().preprocessing.image_size
    pixels = torch.randint(0, 256, (images, 3, size, size), generator=torch.Generator().manual_seed(2),
                           dtype=torch.uint8)  # (B, 3, S, S) as the transform gives them

    def encode() -> None:
        with torch.no_grad():
            model.encode(pixels)

    return Workload("packaged_encoder", f"packaged model's encoder: {images} images at {size} px",
                    model, encode)


def world_caption_tokens(vocab: Vocabulary, data: DataConfig, seed: int = 3) -> list[int]:
    """The tokens of `data.batch_size` scenes' five captions each, as the shapes world writes them (no pixels
    drawn) and the dataset encodes them (`Vocabulary.encode` at data.max_caption_length): a batch's longest
    caption, which sets the steps the LSTM runs, is the world's."""
    rng = np.random.default_rng(seed)
    scenes = (write_captions(sample_scene(rng, data.image_size), rng) for _ in range(data.batch_size))
    return [len(vocab.encode(caption, data.max_caption_length)) for captions in scenes for caption in captions]


def quickstart_step() -> Workload:
    """The quickstart's step: a batch of the shapes world's images at its size, each with its five
    captions' lengths as the world writes them (3 to 36 words, 12 on average; a batch's longest about 33)."""
    config = load_config(CONFIGS / "shapes_lstm.yaml")
    model = build(config, words(39))  # the shapes world's 39 words
    size, images = config.data.image_size, config.data.batch_size
    generator = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (images, 3, size, size), generator=generator, dtype=torch.uint8)  # (B, 3, S, S)
    tokens = world_caption_tokens(model.vocab, config.data)
    batch = caption_rows(pixels, 5, tokens, model.vocab, generator)
    return Workload("quickstart_step", f"quickstart train step: {images} images at {size} px, their 5 captions of "
                    f"{min(tokens) - 2}-{max(tokens) - 2} words as the world writes them", model,
                    train_step(model, config, batch, encoded=False))


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "lstm_train": lstm_train,
    "transformer_train": transformer_train,
    "lstm_beam": lstm_beam,
    "packaged_encoder": packaged_encoder,
    "quickstart_step": quickstart_step,
}
