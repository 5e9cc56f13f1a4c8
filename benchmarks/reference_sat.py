"""The reference Show-Attend-Tell implementation (sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning),
read from its repository at run time (a checkout, or `git show HEAD:models.py` of a git directory)
and driven below as its train.py and caption.py drive its decoder. Nothing of it is copied here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence

DEFAULT_REFERENCE = "/work/.mirror/sgrvinod+a-PyTorch-Tutorial-to-Image-Captioning/repo"


class ReferenceUnavailable(Exception):
    """The reference repository is not where we were told to look; the message says where."""


def reference_location(given: str | None) -> str:
    """--reference, else $CAPTIONER_REFERENCE, else the local mirror."""
    return given or os.environ.get("CAPTIONER_REFERENCE") or DEFAULT_REFERENCE


def read_models_source(location: str) -> str:
    path = Path(location)
    if (path / "models.py").is_file():  # a checkout
        return (path / "models.py").read_text()
    if path.is_dir():  # a bare git directory (or a checkout's .git)
        result = subprocess.run(
            ["git", f"--git-dir={path}", "show", "HEAD:models.py"], capture_output=True, text=True
        )
        if result.returncode == 0:
            return result.stdout
        raise ReferenceUnavailable(f"{path}: not a checkout with models.py, "
                                   "and `git show HEAD:models.py` failed")
    raise ReferenceUnavailable(f"{path}: no such directory (give --reference DIR or set CAPTIONER_REFERENCE)")


def load_reference(location: str | None, device: torch.device) -> types.ModuleType:
    """Import the reference's models.py from a temporary folder; its global `device` set to ours."""
    source = read_models_source(reference_location(location))
    folder = tempfile.mkdtemp(prefix="sat_reference_")
    try:
        file = Path(folder) / "models.py"
        file.write_text(source)
        spec = importlib.util.spec_from_file_location("sat_reference_models", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    module.device = device  # its forward allocates its outputs on this global
    return module


def make_decoder(
    module: types.ModuleType, vocab_size: int, feat_dim: int, device: torch.device, width: int = 512
) -> torch.nn.Module:
    """Its DecoderWithAttention as its train.py builds it (attention, embedding, LSTM of 512)."""
    return module.DecoderWithAttention(
        attention_dim=width, embed_dim=width, decoder_dim=width, vocab_size=vocab_size, encoder_dim=feat_dim,
        dropout=0.5
    ).to(device)


def make_encoder(module: types.ModuleType, device: torch.device) -> torch.nn.Module:
    """Its Encoder (ResNet-101, 14x14 grid, blocks 2-4 fine-tuned as its train.py does), with random
    weights: the ImageNet ones it asks for cannot be downloaded here and cost nothing to run."""
    import torchvision

    original = torchvision.models.resnet101
    module.torchvision.models.resnet101 = lambda *args, **kwargs: original(weights=None)
    try:
        encoder = module.Encoder()
    finally:
        module.torchvision.models.resnet101 = original
    encoder.fine_tune(True)
    return encoder.to(device)


def train_step(
    decoder: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    encoder_out: torch.Tensor,
    caps: torch.Tensor,
    caplens: torch.Tensor,
    alpha_c: float = 1.0,
    grad_clip: float = 5.0,
) -> float:
    """One step of its train.py on encoder output (B, g, g, D), caps (B, T+1), caplens (B, 1):
    its forward (sorting by length), pack_padded loss, doubly stochastic term, clamp, Adam."""
    decoder.train()
    scores, caps_sorted, decode_lengths, alphas, _ = decoder(encoder_out, caps, caplens)
    targets = caps_sorted[:, 1:]
    scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data  # (M, V)
    targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data  # (M,)
    loss = F.cross_entropy(scores, targets)
    loss = loss + alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    for group in optimizer.param_groups:  # its utils.clip_gradient: clamp every gradient value
        for param in group["params"]:
            if param.grad is not None:
                param.grad.data.clamp_(-grad_clip, grad_clip)
    optimizer.step()
    return loss.item()


@torch.no_grad()
def beam_search_one(
    decoder: torch.nn.Module, encoder_out: torch.Tensor, start: int, end: int, beam_size: int = 3,
    max_steps: int = 50
) -> tuple[list[int] | None, int]:
    """Its caption_image_beam_search after the encoder, for one image's output (1, g, g, D), stopping
    after step `max_steps` + 1 -> the best finished sequence (None when none ended) and the steps run.
    `//` where its code divides (written for a torch whose `/` on integer tensors truncated)."""
    decoder.eval()
    k = beam_size
    vocab_size = decoder.vocab_size
    g, dim = encoder_out.size(1), encoder_out.size(3)
    encoder_out = encoder_out.view(1, -1, dim)  # (1, N, D)
    num_pixels = encoder_out.size(1)
    encoder_out = encoder_out.expand(k, num_pixels, dim)  # (k, N, D)
    device = encoder_out.device
    k_prev_words = torch.tensor([[start]] * k, device=device)  # (k, 1)
    seqs = k_prev_words
    top_k_scores = torch.zeros(k, 1, device=device)  # (k, 1)
    seqs_alpha = torch.ones(k, 1, g, g, device=device)  # (k, 1, g, g)
    complete_seqs, complete_seqs_alpha, complete_seqs_scores = [], [], []
    step = 1
    h, c = decoder.init_hidden_state(encoder_out)
    while True:
        embeddings = decoder.embedding(k_prev_words).squeeze(1)  # (s, E)
        awe, alpha = decoder.attention(encoder_out, h)  # (s, D), (s, N)
        alpha = alpha.view(-1, g, g)  # (s, g, g)
        gate = decoder.sigmoid(decoder.f_beta(h))  # (s, D)
        awe = gate * awe
        h, c = decoder.decode_step(torch.cat([embeddings, awe], dim=1), (h, c))  # (s, H)
        scores = F.log_softmax(decoder.fc(h), dim=1)  # (s, V)
        scores = top_k_scores.expand_as(scores) + scores  # (s, V)
        if step == 1:
            top_k_scores, top_k_words = scores[0].topk(k, 0, True, True)  # (s,)
        else:
            top_k_scores, top_k_words = scores.view(-1).topk(k, 0, True, True)  # (s,)
        prev_word_inds = top_k_words // vocab_size  # (s,)
        next_word_inds = top_k_words % vocab_size  # (s,)
        seqs = torch.cat([seqs[prev_word_inds], next_word_inds.unsqueeze(1)], dim=1)  # (s, step+1)
        seqs_alpha = torch.cat([seqs_alpha[prev_word_inds], alpha[prev_word_inds].unsqueeze(1)], dim=1)
        incomplete_inds = [ind for ind, next_word in enumerate(next_word_inds) if next_word != end]
        complete_inds = list(set(range(len(next_word_inds))) - set(incomplete_inds))
        if len(complete_inds) > 0:
            complete_seqs.extend(seqs[complete_inds].tolist())
            complete_seqs_alpha.extend(seqs_alpha[complete_inds].tolist())
            complete_seqs_scores.extend(top_k_scores[complete_inds])
        k -= len(complete_inds)
        if k == 0:
            break
        seqs = seqs[incomplete_inds]
        seqs_alpha = seqs_alpha[incomplete_inds]
        h = h[prev_word_inds[incomplete_inds]]
        c = c[prev_word_inds[incomplete_inds]]
        encoder_out = encoder_out[prev_word_inds[incomplete_inds]]
        top_k_scores = top_k_scores[incomplete_inds].unsqueeze(1)
        k_prev_words = next_word_inds[incomplete_inds].unsqueeze(1)
        if step > max_steps:
            break
        step += 1
    if not complete_seqs_scores:
        return None, step
    best = complete_seqs_scores.index(max(complete_seqs_scores))
    return complete_seqs[best], step
