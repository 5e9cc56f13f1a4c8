"""The SCST reward on the device: CIDEr-D scored with torch ops from flat sorted tensors, no host read.

`host_reward.CiderD`'s numbers from the same n-gram core; n-grams are int64 rolling hashes (a collision at
COCO's scale: ~7e-7), and the table is saved once per node, memory-mapped by every rank. See docs/scst_gpu.md."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import itertools
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch

from captioner.core.errors import DatasetError
from captioner.core.machine_cache import exclusive
from captioner.evaluation.scorers import (CIDER_SCALE, CIDER_SIGMA, MAX_N, cider_clip, cider_length,
                                          cider_length_penalty, inverse_document_frequency, log_images)
from captioner.text.vocab import Vocabulary
from captioner.training.host_reward import Bleu4, reference_corpus

MULTIPLIER = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64: odd, so every step is a bijection mod 2^64
TOKEN_OFFSET = 1 << 32  # token ids (negative ones for out-of-vocabulary reference words) become positive codes
FORMAT = 2  # bump when the arrays or the hash change: it is part of the fingerprint


def ngram_hashes(tokens: torch.Tensor, lengths: torch.Tensor, n: int = MAX_N) -> tuple[torch.Tensor, ...]:
    """Hashes (R, W) int64, valid (R, W) and order (W,) of every 1..n-gram of each row of tokens (R, L) within
    its lengths[r]: W = sum over k of L-k+1, the k-grams of all start positions, order by order."""
    codes = tokens.long() + TOKEN_OFFSET  # (R, L)
    L = tokens.shape[1]
    positions = torch.arange(L, device=tokens.device)  # (L,)
    rolling = torch.zeros_like(codes)  # (R, L): hash of the k-gram starting at each position
    hashes, valid, order = [], [], []
    for k in range(1, n + 1):
        starts = max(L - k + 1, 0)  # k-grams that fit in L positions
        rolling = rolling[:, :starts] * MULTIPLIER + codes[:, k - 1 :]  # (R, starts), wraps mod 2^64
        hashes.append(rolling)
        valid.append(positions[None, :starts] + k <= lengths[:, None])  # (R, starts)
        order.append(torch.full((starts,), k, dtype=torch.long, device=tokens.device))
    return torch.cat(hashes, dim=1), torch.cat(valid, dim=1), torch.cat(order)  # (R, W), (R, W), (W,)


def distinct_counts(hashes: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of hashes (R, W): how often each position's n-gram occurs in its row, and whether the
    position is its n-gram's first occurrence (so each distinct n-gram counts once). (R, W) each."""
    same = (hashes[:, :, None] == hashes[:, None, :]) & valid[:, None, :]  # (R, W, W)
    counts = same.sum(dim=2)  # (R, W)
    positions = torch.arange(hashes.shape[1], device=hashes.device)  # (W,)
    first = valid & (same.to(torch.uint8).argmax(dim=2) == positions)  # (R, W): argmax finds the first equal position
    return counts, first


def padded(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences -> tokens (R, L) zero-padded, lengths (R,)."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))  # (R,)
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))  # (sum,)
    tokens = np.zeros((len(sequences), max(1, int(lengths.max(initial=0)))), dtype=np.int64)  # (R, L)
    tokens[np.arange(tokens.shape[1])[None, :] < lengths[:, None]] = flat  # row-major: each row's prefix in order
    return torch.from_numpy(tokens), torch.from_numpy(lengths)


def sort_pairs(major: torch.Tensor, minor: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts (major, minor) pairs lexicographically (two stable sorts)."""
    by_minor = torch.sort(minor, stable=True).indices
    return by_minor[torch.sort(major[by_minor], stable=True).indices]


def run_starts(*keys: torch.Tensor) -> torch.Tensor:
    """(N,) bool: where a sorted sequence of key tuples starts a new run."""
    change = torch.zeros(keys[0].shape[0], dtype=torch.bool)  # (N,)
    change[:1] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return change


@dataclass
class ReferenceTable:
    """CIDEr-D's references and document frequencies as flat tensors (see the module's docstring)."""

    df_hashes: torch.Tensor  # (D,) int64, sorted: every n-gram of the corpus
    df_counts: torch.Tensor  # (D,) int64: the number of images whose references hold it
    ref_hashes: torch.Tensor  # (G,) int64: per reference caption its distinct n-grams, sorted within the caption
    ref_weights: torch.Tensor  # (G,) float64: tf * idf of each
    ref_offsets: torch.Tensor  # (Rc+1,) int64: caption r's n-grams are [ref_offsets[r], ref_offsets[r+1])
    ref_norms: torch.Tensor  # (Rc, n) float64: L2 norm of each caption's weights per order
    ref_lengths: torch.Tensor  # (Rc,) int64: bigram count (pycocoevalcap's length)
    image_offsets: torch.Tensor  # (I+1,) int64: image i's captions are [image_offsets[i], image_offsets[i+1])
    # (5,) float64, always on the host: log(number of images), n, sigma, most captions of an image,
    # the longest caption's number of distinct n-grams (the width of the lookup rows)
    meta: torch.Tensor

    @classmethod
    def build(cls, references: Sequence[Sequence[Sequence[int]]], chunk: int = 20000) -> ReferenceTable:
        """From each image's reference token sequences (ids, <eos> included where the reward has it);
        the document frequencies come from the same images, as `host_reward.CaptionReward` has them."""
        if not references:
            raise DatasetError("reward references: the document-frequency corpus is empty")
        for i, refs in enumerate(references):
            if not refs:
                raise DatasetError(f"reward references: image {i} has no references")
        captions_per_image = torch.tensor([len(refs) for refs in references], dtype=torch.long)  # (I,)
        image_offsets = torch.cat([torch.zeros(1, dtype=torch.long), captions_per_image.cumsum(0)])  # (I+1,)
        # per chunk: (caption, hash, order, tf) and (hash) of distinct (image, n-gram)
        caption_grams, image_grams = [], []
        for start in range(0, len(references), chunk):
            images = references[start : start + chunk]
            first_caption = int(image_offsets[start])
            tokens, lengths = padded([ref for refs in images for ref in refs])  # (Rk, L), (Rk,)
            hashes, valid, order = ngram_hashes(tokens, lengths)  # (Rk, W) each, (W,)
            caption = torch.arange(tokens.shape[0])[:, None].expand_as(hashes)[valid] + first_caption  # (M,)
            gram, gram_order = hashes[valid], order[None, :].expand_as(hashes)[valid]  # (M,) each
            perm = sort_pairs(caption, gram)  # (M,)
            caption, gram, gram_order = caption[perm], gram[perm], gram_order[perm]
            starts = run_starts(caption, gram)  # (M,)
            run = starts.cumsum(0) - 1  # (M,): the distinct (caption, n-gram) each belongs to
            tf = torch.zeros(int(starts.sum()), dtype=torch.long).index_add_(0, run, torch.ones_like(run))  # (Mc,)
            caption, gram, gram_order = caption[starts], gram[starts], gram_order[starts]  # (Mc,) each
            caption_grams.append((caption, gram, gram_order, tf))
            image = torch.searchsorted(image_offsets, caption, right=True) - 1  # (Mc,)
            perm = sort_pairs(image, gram)
            image, by_image = image[perm], gram[perm]
            image_grams.append(by_image[run_starts(image, by_image)])  # each image's distinct n-grams
        df_hashes, df_counts = torch.unique(torch.cat(image_grams), return_counts=True)  # (D,) each, sorted
        caption, gram, gram_order, tf = (torch.cat(parts) for parts in zip(*caption_grams))  # (G,) each
        log_n = log_images(len(references))
        df = df_counts[torch.searchsorted(df_hashes, gram)]  # (G,): every reference n-gram is in the corpus
        weights = tf.double() * inverse_document_frequency(df.double(), log_n)  # (G,)
        num_captions = int(image_offsets[-1])
        cell = caption * MAX_N + gram_order - 1  # (G,): each weight's (caption, order)
        norms = torch.zeros(num_captions * MAX_N, dtype=torch.float64).index_add_(0, cell, weights * weights)  # (Rc*n,)
        per_caption = torch.bincount(caption, minlength=num_captions)  # (Rc,)
        bigram_tf = torch.where(gram_order == 2, tf, 0)  # (G,)
        bigrams = torch.zeros(num_captions, dtype=torch.long).index_add_(0, caption, bigram_tf)  # (Rc,)
        ref_offsets = torch.cat([torch.zeros(1, dtype=torch.long), per_caption.cumsum(0)])  # (Rc+1,)
        meta = torch.tensor([log_n, MAX_N, CIDER_SIGMA, float(captions_per_image.max()), float(per_caption.max())],
                            dtype=torch.float64)  # (5,)
        ref_norms = norms.sqrt().view(num_captions, MAX_N)  # (Rc, n)
        return cls(df_hashes, df_counts, gram, weights, ref_offsets, ref_norms, bigrams, image_offsets, meta)

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float64) -> ReferenceTable:
        """The table on `device`, its weights in `dtype` (float32 on a GPU); `meta` stays on the
        host, so that scoring reads its constants without waiting for the device."""
        def moved(value: torch.Tensor) -> torch.Tensor:
            return (value.to(dtype) if value.is_floating_point() else value).to(device)

        return replace(self, **{f.name: moved(getattr(self, f.name)) for f in fields(self) if f.name != "meta"})

    def save(self, folder: str | os.PathLike[str]) -> None:
        """One .npy per array in `folder` (written to a temporary name, then renamed: a reader
        never sees half a table)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for f in fields(self):
            partial = folder / f"{f.name}.partial.npy"
            np.save(partial, getattr(self, f.name).numpy())
            os.replace(partial, folder / f"{f.name}.npy")
        (folder / "complete").touch()

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> ReferenceTable:
        """Memory-mapped read-only: processes that load the same folder share its pages."""
        folder = Path(folder)
        if not (folder / "complete").is_file():
            raise DatasetError(f"{folder}: not a complete reward reference table (no 'complete' marker)")
        with warnings.catch_warnings():  # torch warns that the mapping is not writable: nothing here writes to it
            warnings.simplefilter("ignore", UserWarning)
            return cls(*(torch.from_numpy(np.load(folder / f"{f.name}.npy", mmap_mode="r")) for f in fields(cls)))

    def score(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """(C,) CIDEr-D of candidate c, tokens[c, :lengths[c]] (words, then <eos> if it ended),
        against the references of image images[c]; on the table's device, in its weights' dtype.
        No value is read back to the host. Autocast is off here: its bf16 matmuls would round
        the per-order sums to 3 digits."""
        with torch.autocast(tokens.device.type, enabled=False):
            log_num_images, n, sigma, max_refs, longest_slice = self.meta.tolist()  # host constants: no device wait
            n, max_refs, longest_slice, dtype = int(n), int(max_refs), int(longest_slice), self.ref_weights.dtype
            hashes, valid, order = ngram_hashes(tokens, lengths, n)  # (C, W), (C, W), (W,)
            tf, first = distinct_counts(hashes, valid)  # (C, W) each
            found = torch.searchsorted(self.df_hashes, hashes).clamp(max=len(self.df_hashes) - 1)  # (C, W)
            # (C, W): 0 for n-grams no reference has
            df = torch.where(self.df_hashes[found] == hashes, self.df_counts[found], 0)
            idf = inverse_document_frequency(df.to(dtype), log_num_images)  # (C, W)
            hyp = torch.where(first, tf.to(dtype) * idf, 0.0)  # (C, W): each distinct n-gram's weight, once
            order_onehot = torch.nn.functional.one_hot(order - 1, n).to(dtype)  # (W, n)
            hyp_norms = ((hyp * hyp) @ order_onehot).sqrt()  # (C, n)
            hyp_length = cider_length(lengths)  # (C,)

            # The candidate's image's references: slots j < max_refs, true where the image has a j-th caption.
            slot = torch.arange(max_refs, device=tokens.device)  # (J,)
            first_ref = self.image_offsets[images]  # (C,)
            num_refs = self.image_offsets[images + 1] - first_ref  # (C,)
            has_ref = slot[None, :] < num_refs[:, None]  # (C, J)
            ref = torch.where(has_ref, first_ref[:, None] + slot[None, :], 0)  # (C, J)
            # Each reference's slice as a padded sorted row, then one batched searchsorted per row.
            start = self.ref_offsets[ref]  # (C, J)
            count = self.ref_offsets[ref + 1] - start  # (C, J)
            column = torch.arange(longest_slice, device=tokens.device)  # (S,)
            inside = column < count[:, :, None]  # (C, J, S)
            last = max(len(self.ref_hashes) - 1, 0)
            rows = torch.where(inside, self.ref_hashes[(start[:, :, None] + column).clamp(max=last)],
                               torch.iinfo(torch.long).max)  # (C, J, S)
            target = hashes[:, None, :].expand(-1, rows.shape[1], -1).contiguous()  # (C, J, W)
            found = torch.searchsorted(rows, target).clamp(max=rows.shape[2] - 1)  # (C, J, W)
            hit = (found < count[:, :, None]) & (rows.gather(2, found) == target)  # (C, J, W)
            position = (start[:, :, None] + found).clamp(max=last)  # (C, J, W): index into the flat arrays
            ref_weight = torch.where(hit, self.ref_weights[position], 0.0)  # (C, J, W)
            clipped = cider_clip(hyp[:, None, :], ref_weight)  # (C, J, W): min(h, r) * r
            overlap = clipped @ order_onehot  # (C, J, n)
            ref_norms = self.ref_norms[ref]  # (C, J, n)
            denominator = hyp_norms[:, None, :] * ref_norms  # (C, J, n): a zero norm means a zero overlap
            cosine = overlap / torch.where(denominator == 0, 1.0, denominator)  # (C, J, n)
            delta = (hyp_length[:, None] - self.ref_lengths[ref]).to(dtype)  # (C, J)
            penalty = cider_length_penalty(delta, sigma)  # (C, J)
            per_ref = cosine.sum(dim=2) * penalty * has_ref  # (C, J)
            return per_ref.sum(dim=1) / n / num_refs.to(dtype) * CIDER_SCALE  # (C,)


def fingerprint(vocab_words: Sequence[str], references: Sequence[Sequence[str]]) -> str:
    """A digest of everything a table depends on: the vocabulary, every image's reference texts
    in order, n, sigma and the table format."""
    digest = hashlib.sha256(f"reward-table v{FORMAT} n={MAX_N} sigma={CIDER_SIGMA}\n".encode())
    digest.update("\x1f".join(vocab_words).encode())
    for captions in references:
        digest.update(b"\x1e" + "\x1f".join(captions).encode())
    return digest.hexdigest()[:20]


def cached_table(folder: str | os.PathLike[str], key: str, build: Callable[[], ReferenceTable]) -> ReferenceTable:
    """The table saved under folder/key, built by `build()` and saved by the first process that
    gets there (a file lock makes the other ranks of the node wait, then map the same file)."""
    target = Path(folder) / f"reward_table_{key}"
    with exclusive(target.name, target.parent):
        if not (target / "complete").is_file():
            build().save(target)
            # the build's freed heap back to the system: glibc keeps it (~1.2 GB at COCO scale) otherwise
            with contextlib.suppress(OSError, AttributeError):  # no glibc: nothing to hand back
                ctypes.CDLL("libc.so.6").malloc_trim(0)
    return ReferenceTable.load(target)


class DeviceReward:
    """cider_weight * CIDEr-D on the samples' device (`CaptionReward`'s numbers to 1e-12 in float64), plus
    bleu_weight * BLEU-4 on the host (one device wait per step, only when bleu_weight > 0). With `cache_dir`
    the table is saved there under a fingerprint and memory-mapped by every process of the node."""

    def __init__(self, vocab: Vocabulary, references: Sequence[Sequence[str]], cider_weight: float = 1.0,
                 bleu_weight: float = 0.0, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.cider_weight, self.bleu_weight = cider_weight, bleu_weight
        # Tokenised only when something needs it: a table already cached needs no references.
        corpus = functools.cache(lambda: reference_corpus(vocab, references))
        build = lambda: ReferenceTable.build(corpus())  # noqa: E731
        self.table = cached_table(cache_dir, fingerprint(vocab.words, references), build) if cache_dir else build()
        self.bleu = Bleu4(corpus() if bleu_weight else ())
        self._tables: dict[torch.device, ReferenceTable] = {}

    def on(self, device: torch.device) -> ReferenceTable:
        """The table on `device`, copied there once."""
        if device not in self._tables:
            self._tables[device] = self.table if device.type == "cpu" else self.table.to(device, torch.float32)
        return self._tables[device]

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """(C,) rewards of the captions tokens[c, :lengths[c]] (word ids, then <eos> where it
        ended) against the references of dataset image images[c]; on tokens' device."""
        table = self.on(tokens.device)
        reward = torch.zeros(tokens.shape[0], dtype=table.ref_weights.dtype, device=tokens.device)  # (C,)
        if self.cider_weight:
            reward = reward + self.cider_weight * table.score(tokens, lengths, images)
        if self.bleu_weight:
            candidates = [row[:length] for row, length in zip(tokens.tolist(), lengths.tolist())]
            bleu = self.bleu.score(candidates, images.tolist())  # (C,) on the host
            reward = reward + self.bleu_weight * torch.as_tensor(bleu, dtype=reward.dtype).to(reward.device)
        return reward
