"""Self-critical sequence training, the objective of the second stage (Rennie et al. 2017; Luo 2020).

    loss = -mean_over_samples[(reward - baseline) * sum of log p(word) over the words and <eos>]

Per image `scst.samples` sampled captions are rewarded with CIDEr-D (plus an optional BLEU-4 term) against
all its references; the baseline is the greedy caption's reward (decoded in eval mode, without gradients)
or the mean of the image's other samples. `scst.xent_weight` mixes in the cross-entropy loss on the
references. A step reads nothing back from the device (tests/test_sync.py): docs/scst.md and
docs/scst_gpu.md say how. `SelfCritical` is called like `loop.caption_loss`, so `fit` only picks it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence

import torch

from captioner.core.config_sections import Config, ScstConfig
from captioner.data.batching import CaptionBatch
from captioner.models.captioner import Captioner
from captioner.models.decoder import reads_are_free
from captioner.models.decoding.rules import DecodeOptions, SpecialTokens
from captioner.models.decoding.sampling import SampledCaptions, sample_captions, scored_by_teacher_forcing
from captioner.text.vocab import Vocabulary
from captioner.training.device_reward import DeviceReward
from captioner.training.loop import Loss, Objective

# (tokens (C, T), lengths (C,), dataset image indices (C,)) -> (C,) rewards on the tokens' device
Reward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mean_of_others(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """(B*n,) rewards, n consecutive per image -> each sample's baseline: the mean of the other n-1."""
    per_image = rewards.view(-1, n)  # (B, n)
    return ((per_image.sum(dim=1, keepdim=True) - per_image) / (n - 1)).view(-1)  # (B*n,)


class SelfCritical:
    """The SCST objective over one stage's training images: `references[i]` are image i's captions (the
    reward's document frequencies too), `reward` replaces CIDEr-D (tests favour a word with it), `cache_dir`
    keeps the reward's table for every rank of the node, `xent` is what `scst.xent_weight` mixes in."""

    def __init__(self, settings: ScstConfig, vocab: Vocabulary, references: Sequence[Sequence[str]],
                 reward: Reward | None = None, xent: Objective | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.settings, self.vocab, self.xent = settings, vocab, xent
        self.reward = reward or DeviceReward(vocab, references, settings.cider_weight, settings.bleu_weight, cache_dir)
        self.special = SpecialTokens.of(vocab)  # the ids decoding treats apart, as `Captioner.special_tokens`
        # The samples' and the greedy baseline's decoding: the same length and ending rule.
        shared = {"max_length": settings.max_length, "suppress_bad_endings": settings.suppress_bad_endings}
        self.greedy = DecodeOptions(beam_size=1, **shared)
        drawing = {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
        self.sampling = DecodeOptions(sample=True, n_best=settings.samples, **drawing, **shared)
        self.reward_seconds = 0.0  # host time spent in the reward, in total (launch time only on a GPU)
        if settings.xent_weight and xent is None:
            raise ValueError("SelfCritical: scst.xent_weight needs the cross-entropy objective (xent)")

    logged = ("loss", "reward", "baseline", "advantage", "advantage_abs", "sample_length", "sample_logprob",
              "reward_seconds", "xent")

    def score(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """(C,) rewards as float32 on the tokens' device, timed into `reward_seconds`."""
        start = time.perf_counter()
        rewards = self.reward(tokens, lengths, images).float()  # (C,)
        self.reward_seconds += time.perf_counter() - start
        return rewards

    def __call__(self, model: Captioner, batch: CaptionBatch, config: Config, encoded: bool,
                 totals: tuple[int, ...] | None = None, forward: object | None = None) -> Loss:
        """(loss, logged values as 0-d device tensors); `totals` = (target words, captions, images) over every
        rank. `forward` goes unused: sampling runs the bare decoder, and `train_one_epoch` averages its
        gradients. Nothing is read back from the device (except by a BLEU term in the reward)."""
        reward_before = self.reward_seconds
        n = self.settings.samples
        feats = model.stored_features(batch.images) if encoded else model.encode(batch.images)[0]  # (B, N, D)
        images = batch.indices.to(feats.device, non_blocking=True)  # (B,): dataset index of each image
        samples, logprobs = self.sample(model, feats)  # (B*n, T), (B*n,)
        rewards = self.score(samples.tokens, samples.lengths, images.repeat_interleave(n))  # (B*n,)
        baseline = self.baseline(model, feats, images, rewards)  # (B*n,)
        # This rank's images are a share of the global batch's (`totals[2]`): the loss and logged means become
        # shares too, so that averaging the gradients and summing the logged values over ranks give its means.
        share = len(batch.indices) / totals[2] if totals is not None and len(totals) > 2 else 1.0
        loss = -((rewards - baseline) * logprobs).mean() * share
        xent = torch.zeros((), device=loss.device)
        if self.settings.xent_weight:
            # Teacher forcing on every reference of the batch's images; `totals` make it this rank's share.
            xent, _ = self.xent(model, batch, config, encoded, totals)
            loss = loss + self.settings.xent_weight * xent
        logged = self.logged_means(samples, logprobs, rewards, baseline, share, self.reward_seconds - reward_before)
        return loss, {"loss": loss.detach().float(), **logged, "xent": xent.detach().float()}

    def sample(self, model: Captioner, feats: torch.Tensor) -> tuple[SampledCaptions, torch.Tensor]:
        """`scst.samples` captions per image and their log-probabilities with gradients (B*n,),
        drawn in the decoder's mode that `scst.dropout` asks for (its own mode restored after)."""
        s, vocab = self.settings, self.vocab
        decoder_was_training = model.decoder.training
        model.decoder.train(s.dropout)  # without dropout the policy sampled and pushed is the test-time decoder
        # On the CPU without dropout: sample without gradients, then score the samples in one
        # teacher-forced pass (the same log-probabilities, a fraction of the work). With dropout
        # the scoring pass would draw other masks than the sampling did; on a GPU it would read
        # the samples' lengths back from the device: there the roll-out records them with gradients.
        by_teacher_forcing = not s.dropout and reads_are_free(feats.device)
        try:
            with torch.no_grad() if by_teacher_forcing else contextlib.nullcontext():
                samples = sample_captions(model.decoder, feats, self.special, self.sampling)  # (B*n, T) each
            if by_teacher_forcing:
                logprobs = scored_by_teacher_forcing(model.decoder, feats, samples, vocab.bos_id)  # (B*n,)
            else:
                logprobs = samples.caption_logprobs()  # (B*n,)
        finally:
            model.decoder.train(decoder_was_training)
        return samples, logprobs

    def baseline(self, model: Captioner, feats: torch.Tensor, images: torch.Tensor,
                 rewards: torch.Tensor) -> torch.Tensor:
        """Each sample's baseline (B*n,): its image's greedy caption's reward, decoded in eval
        mode without gradients, or the mean reward of the image's other samples."""
        n = self.settings.samples
        if self.settings.baseline != "greedy":
            return mean_of_others(rewards, n)  # (B*n,)
        was_training = model.training
        model.eval()
        try:
            greedy = sample_captions(model.decoder, feats.detach(), self.special, self.greedy)  # (B, T) each
        finally:
            model.train(was_training)
        return self.score(greedy.tokens, greedy.lengths, images).repeat_interleave(n)  # (B*n,)

    def logged_means(self, samples: SampledCaptions, logprobs: torch.Tensor, rewards: torch.Tensor,
                     baseline: torch.Tensor, share: float, reward_seconds: float) -> dict[str, torch.Tensor]:
        """The step's logged values but the loss and xent, as 0-d tensors on the device (this
        rank's `share` of each), read back only every `log_every` steps."""
        advantage = rewards - baseline  # (B*n,)
        words = (samples.mask & (samples.tokens != self.vocab.eos_id)).sum(dim=1)  # (B*n,): <eos> is not a word
        means = torch.stack([
            rewards.mean(),
            baseline.mean(),
            advantage.mean(),  # with the mean baseline 0 by construction
            advantage.abs().mean(),  # the size of the policy-gradient weights
            words.float().mean(),
            # per word and <eos>: how probable the model finds its own samples. A run that pushes its
            # losing samples down without limit shows it here first (docs/experiments.md, epoch 4).
            (logprobs.detach() / samples.lengths.clamp(min=1)).mean(),
        ])  # (6,) on the device
        seconds = torch.tensor([reward_seconds], dtype=torch.float32).to(rewards.device, non_blocking=True)  # (1,)
        values = torch.cat([means.detach().float(), seconds]) * share  # (P-2,): wall time of this step's scoring last
        return dict(zip(self.logged[1:-1], values.unbind()))
