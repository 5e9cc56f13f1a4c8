"""Self-critical training: baselines, the sign of the policy gradient, and the stage end to end."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, TINY_MODEL, tiny_config, tiny_model

from captioner.apps.cli import main
from captioner.core.config_sections import ScstConfig
from captioner.core.errors import CheckpointError, ConfigError
from captioner.data.batching import CaptionBatch
from captioner.models.checkpoint import load_captioner, read_checkpoint
from captioner.models.decoding import DecodeOptions, SpecialTokens, greedy_decode
from captioner.models.decoding.sampling import sample_captions, scored_by_teacher_forcing
from captioner.training.scst import SelfCritical, mean_of_others


def feature_batch(model, images: int = 3, seed: int = 0) -> CaptionBatch:
    """Cached-feature batch: random grids; the references live in the objective, not here."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(images, 16, model.encoder.out_dim, generator=g)  # (B, N, D)
    tokens = torch.zeros(images, 2, dtype=torch.long)  # unused by SCST
    return CaptionBatch(feats, tokens, torch.full((images,), 2), torch.arange(images), torch.arange(10, 10 + images))


def ended(tokens: list[int], finished: bool, eos_id: int) -> list[int]:
    """A greedy caption as the reward reads it: its words, then <eos> when it ended."""
    return [*tokens, eos_id] if finished else list(tokens)


def as_lists(tokens: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    return [row[:length] for row, length in zip(tokens.tolist(), lengths.tolist())]


class Recorder:
    """A reward that favours one word (its count in the caption) and remembers what it scored."""

    def __init__(self, word_id: int) -> None:
        self.word_id = word_id
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        candidates = as_lists(tokens, lengths)
        self.calls.append((candidates, images.tolist()))
        return torch.tensor([float(c.count(self.word_id)) for c in candidates])


def test_mean_baseline_is_the_mean_of_the_other_samples() -> None:
    rewards = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])  # two images, three samples each
    assert mean_of_others(rewards, 3).tolist() == [4.0, 3.5, 1.5, 1.5, 1.5, 0.0]


class Scripted(Recorder):
    """Rewards that differ within every image (0, 1, 4, 9 for its four samples), whatever the
    captions say: a random tiny model rarely writes a chosen word, and all-zero rewards would let
    a wrong baseline pass."""

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        super().__call__(tokens, lengths, images)
        return torch.tensor([float((i % 4) ** 2) for i in range(len(images))])


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_mean_baseline_through_the_objective(decoder: str) -> None:
    model = tiny_model(f"model.decoder.type={decoder}").train()
    reward = Scripted(model.vocab.index["red"])
    objective = SelfCritical(ScstConfig(samples=4, baseline="mean", max_length=6), model.vocab, [], reward)
    torch.manual_seed(0)
    loss, parts = objective(model, feature_batch(model), tiny_config(), encoded=True)
    candidates, keys = reward.calls[0]
    assert len(reward.calls) == 1 and len(candidates) == 12  # no greedy decoding for this baseline
    assert keys == [10] * 4 + [11] * 4 + [12] * 4  # samples are scored against their own image
    r = np.array([[0.0, 1.0, 4.0, 9.0]] * 3)  # (3, 4)
    expected = (r.sum(1, keepdims=True) - r) / 3  # (3, 4): the mean of the others of the same image
    assert float(parts["baseline"]) == pytest.approx(expected.mean())
    # float32; sum of (r - mean of others) over an image is 0
    assert float(parts["advantage"]) == pytest.approx(0.0, abs=1e-6)
    # 4.0 with the others' mean; a mean over all four samples (the sample's own reward in its
    # baseline) would give 3.0, a mean over the whole batch the same.
    assert float(parts["advantage_abs"]) == pytest.approx(np.abs(r - expected).mean()) == pytest.approx(4.0)
    assert loss.requires_grad


def test_sample_logprob_is_the_mean_per_token_log_probability_of_the_samples() -> None:
    """The logged `sample_logprob` (the divergence's early sign): each sample's log-probability
    over its words and <eos>, divided by that count, averaged; recomputed here from the same draw."""
    model = tiny_model().train()
    settings = ScstConfig(samples=4, baseline="mean", max_length=6, dropout=False)
    objective = SelfCritical(settings, model.vocab, [], Scripted(model.vocab.index["red"]))
    batch = feature_batch(model)
    torch.manual_seed(0)
    _, parts = objective(model, batch, tiny_config(), encoded=True)
    torch.manual_seed(0)
    feats = model.stored_features(batch.images)  # (B, N, D), as the objective reads them in train mode
    model.decoder.eval()  # the objective samples without dropout (scst.dropout false)
    with torch.no_grad():  # as the objective draws them on the CPU: the same rows stepped, the same draws
        samples = sample_captions(model.decoder, feats, objective.special, objective.sampling)
    per_token = samples.caption_logprobs().detach() / samples.lengths  # (B*n,)
    assert float(parts["sample_logprob"]) == pytest.approx(float(per_token.mean()), rel=1e-5)
    assert float(parts["sample_logprob"]) < 0 and float(per_token.min()) < float(per_token.max())  # not one constant


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_greedy_baseline_is_the_reward_of_the_greedy_caption(decoder: str) -> None:
    model = tiny_model(f"model.decoder.type={decoder}").train()
    vocab = model.vocab
    reward = Recorder(vocab.index["red"])
    objective = SelfCritical(ScstConfig(samples=3, baseline="greedy", max_length=6), vocab, [], reward)
    batch = feature_batch(model)
    _, parts = objective(model, batch, tiny_config(), encoded=True)
    assert model.training  # the greedy baseline decodes in eval mode and restores the mode
    model.eval()
    greedy = greedy_decode(model.decoder, batch.images, SpecialTokens(vocab.bos_id, vocab.eos_id, (0, 1, 3)),
                           DecodeOptions(max_length=6))
    greedy_candidates = [ended(h.tokens, h.finished, vocab.eos_id) for h in greedy]
    (samples, sample_keys), (scored, keys) = reward.calls
    assert scored == greedy_candidates and keys == [10, 11, 12]
    assert float(parts["baseline"]) == pytest.approx(np.mean([c.count(reward.word_id) for c in greedy_candidates]))
    assert float(parts["reward"]) == pytest.approx(np.mean([c.count(reward.word_id) for c in samples]))


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_scst_top_k_restricts_what_the_samples_draw(decoder: str) -> None:
    """`scst.top_k` reaches the sampler: with k = 1 every sample is the image's greedy caption."""
    model = tiny_model(f"model.decoder.type={decoder}").train()
    vocab = model.vocab
    reward = Recorder(vocab.index["red"])
    for top_k in (1, 0):
        settings = ScstConfig(samples=3, baseline="mean", max_length=6, top_k=top_k, dropout=False)
        torch.manual_seed(0)
        SelfCritical(settings, vocab, [], reward)(model, feature_batch(model), tiny_config(), encoded=True)
    model.eval()
    greedy = greedy_decode(model.decoder, feature_batch(model).images,
                           SpecialTokens(vocab.bos_id, vocab.eos_id, (0, 1, 3)), DecodeOptions(max_length=6))
    greedy_captions = [ended(h.tokens, h.finished, vocab.eos_id) for h in greedy for _ in range(3)]
    (top_1, _), (unrestricted, _) = reward.calls
    assert top_1 == greedy_captions and unrestricted != greedy_captions  # k = 0 draws from every word


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
@pytest.mark.parametrize("baseline", ["greedy", "mean"])
def test_steps_raise_the_probability_of_a_rewarded_word(decoder: str, baseline: str) -> None:
    torch.set_num_threads(1)
    model = tiny_model(f"model.decoder.type={decoder}", "model.decoder.dropout=0.0").train()
    vocab = model.vocab
    word = vocab.index["star"]
    objective = SelfCritical(ScstConfig(samples=8, baseline=baseline, max_length=5), vocab, [], Recorder(word))
    batch = feature_batch(model, images=4)

    def probability() -> float:  # mean probability of the word at each of the greedy caption's first steps
        with torch.no_grad():
            memory = model.decoder.prepare(batch.images)
            state = model.decoder.init_state(memory)
            prev = torch.full((4,), vocab.bos_id)
            total = 0.0
            for _ in range(3):
                logprobs, _, state = model.decoder.step(memory, prev, state)  # (B, V)
                total += float(logprobs[:, word].exp().mean())
                prev = logprobs.argmax(-1)
            return total / 3

    before = probability()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(0)
    for _ in range(4):
        loss, _ = objective(model, batch, tiny_config(), encoded=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = probability()
    assert after > before * 1.5, (before, after)


class Constant:
    """A reward that is the same for every caption: the policy gradient is exactly zero."""

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return torch.ones(tokens.shape[0])


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_xent_weight_adds_the_cross_entropy_stage_loss(decoder: str) -> None:
    from captioner.training.loop import caption_loss

    model = tiny_model(f"model.decoder.type={decoder}", "model.decoder.dropout=0.0").train()
    vocab = model.vocab
    words = [vocab.index[w] for w in ("a", "red", "star")]
    # (2, 5)
    tokens = torch.tensor(
        [[vocab.bos_id, *words, vocab.eos_id], [vocab.bos_id, *words[:2], vocab.eos_id, vocab.pad_id]])
    batch = feature_batch(model, images=2)
    batch = CaptionBatch(batch.images, tokens, torch.tensor([5, 4]), torch.tensor([0, 1]), batch.indices)
    settings = ScstConfig(samples=3, baseline="mean", max_length=6, xent_weight=0.7)
    objective = SelfCritical(settings, vocab, [], Constant(), xent=caption_loss)
    loss, parts = objective(model, batch, tiny_config(), encoded=True)
    xent, _ = caption_loss(model, batch, tiny_config(), encoded=True)
    assert float(parts["advantage_abs"]) == 0.0  # equal rewards: the sampled captions weigh nothing
    assert float(loss.detach()) == pytest.approx(0.7 * float(xent.detach()), rel=1e-6)
    assert float(parts["xent"]) == pytest.approx(float(xent.detach()), rel=1e-6)
    loss.backward()
    assert model.decoder.embedding.weight.grad[words[2]].abs().sum() > 0  # the references' words get gradients
    with pytest.raises(ValueError, match="xent_weight"):
        SelfCritical(settings, vocab, [], Constant())


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_the_cpu_steps_teacher_forced_scoring_gives_the_roll_outs_loss_and_gradients(
        decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU without dropout, the samples are drawn without gradients and scored by teacher
    forcing; with `scst.dropout` (a no-op here, the model's dropout is 0) the roll-out records
    them with gradients. Same samples, same loss, same gradients."""
    from captioner.models.decoding import sampling
    from captioner.training import scst

    # Both steps draw with the static roll-out, so that they draw the same samples (without
    # gradients the CPU's roll-out steps fewer rows, and so draws other ones).
    monkeypatch.setattr(sampling, "reads_are_free", lambda device: False)
    model = tiny_model(f"model.decoder.type={decoder}", "model.decoder.dropout=0.0").train()
    batch = feature_batch(model, images=4)
    scorings = []
    monkeypatch.setattr(scst, "scored_by_teacher_forcing",
                        lambda *a: scorings.append(1) or scored_by_teacher_forcing(*a))

    def step(dropout: bool) -> tuple[float, list[torch.Tensor], list[list[int]]]:
        reward = Scripted(model.vocab.index["red"])
        objective = SelfCritical(ScstConfig(samples=4, baseline="mean", max_length=8, dropout=dropout),
                                 model.vocab, [], reward)
        model.zero_grad()
        torch.manual_seed(0)
        loss, _ = objective(model, batch, tiny_config(), encoded=True)
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in model.decoder.parameters()
                                      if p.grad is not None], reward.calls[-1][0]

    (scored_loss, scored_grads, scored_samples), (rolled_loss, rolled_grads, rolled_samples) = step(False), step(True)
    assert scorings == [1]  # the first step scored by teacher forcing, the second by the roll-out
    assert scored_samples == rolled_samples and len({len(c) for c in scored_samples}) > 1
    assert scored_loss == pytest.approx(rolled_loss, rel=1e-5, abs=1e-6)
    for got, want in zip(scored_grads, rolled_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_scst_dropout_off_samples_the_test_time_decoder(decoder: str) -> None:
    model = tiny_model(f"model.decoder.type={decoder}", "model.decoder.dropout=0.5").train()
    reward = Recorder(model.vocab.index["red"])
    batch = feature_batch(model, images=4)

    def sampled(dropout: bool) -> tuple[list[list[int]], float]:
        objective = SelfCritical(ScstConfig(samples=4, baseline="mean", max_length=8, dropout=dropout),
                                 model.vocab, [], reward)
        torch.manual_seed(0)
        loss, _ = objective(model, batch, tiny_config(), encoded=True)
        return reward.calls[-1][0], float(loss.detach())

    off = sampled(False)
    assert model.training and model.decoder.training  # the mode is restored for the backward pass and the next step
    model.eval()
    test_time = sampled(False)
    model.train()
    assert off == test_time  # the same samples and log-probabilities as the eval-mode decoder
    assert sampled(True) != off  # with dropout on they differ


# --- the stage end to end: cross-entropy, then SCST from its checkpoint -----------------------------

TINY = [
    "data.shapes_num_train=48",
    "data.shapes_num_val=8",
    "data.shapes_num_test=4",
    *TINY_MODEL,
    "data.batch_size=16",
    "model.decoder.dropout=0.0",
    "train.epochs=1",
    "train.warmup_steps=1",
    "train.val_metric=CIDEr",
    "decode.max_length=12",
]


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_init_from_a_checkpoint_trains_an_scst_epoch(decoder: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = f"data.root={tmp_path / 'shapes'}"
    config = str(REPO / f"configs/shapes_{decoder}.yaml")
    assert main(["train", config, *TINY, data, f"train.out_dir={tmp_path / 'xe'}"]) == 0
    xe = tmp_path / "xe" / "best.pt"
    scst = [*TINY, data, f"train.out_dir={tmp_path / 'scst'}", "train.stage=scst", "scst.samples=3",
            "scst.max_length=8"]
    assert main(["train", config, *scst, "train.lr=1e-4", "--init", str(xe)]) == 0

    rows = list(csv.DictReader(open(tmp_path / "scst" / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [0, 1]  # epoch 0: the starting model, validated only
    assert rows[0]["val_CIDEr"] and not rows[0]["train_reward"]
    for key in ("train_reward", "train_baseline", "train_advantage", "train_sample_length", "train_sample_logprob",
                "train_xent", "val_CIDEr"):
        assert rows[1][key], key
    assert 0 < float(rows[1]["train_sample_length"]) <= 8
    assert int(rows[1]["step"]) == 3  # 48 images, 16 per batch: one item per image
    # best.pt is the better of the starting model and epoch 1 on val.
    best = read_checkpoint(tmp_path / "scst" / "best.pt")["train_state"]
    assert best["best_epoch"] == (1 if float(rows[1]["val_CIDEr"]) > float(rows[0]["val_CIDEr"]) else 0)
    started, trained = read_checkpoint(xe), read_checkpoint(tmp_path / "scst" / "last.pt")
    assert trained["vocab"] == started["vocab"]  # the vocabulary came from the checkpoint
    assert trained["config"]["model"] == started["config"]["model"]
    assert trained["train_state"]["step"] == 3  # a fresh schedule: steps count from 0
    assert any(not torch.equal(started["model"][k], v) for k, v in trained["model"].items())  # it trained
    encoder = [k for k in started["model"] if k.startswith("encoder.")]
    # the encoder is fine-tuned
    assert encoder and any(not torch.equal(started["model"][k], trained["model"][k]) for k in encoder)
    assert load_captioner(tmp_path / "scst" / "last.pt").vocab.words == started["vocab"]

    # Resume continues the SCST stage where it stopped: a second epoch, the same objective.
    assert main(["train", config, *scst, "train.lr=1e-4", "train.epochs=2", f"train.init={xe}", "--resume"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "scst" / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2] and int(rows[2]["step"]) == 6
    assert rows[2]["train_reward"]

    with pytest.raises(CheckpointError,
                       match=r"model\.decoder\.dropout is 0\.0 in the checkpoint but 0\.3 in the config"):
        from captioner.core.config import load_config
        from captioner.training.fit import fit

        # a new run (its own folder: scst/ holds the run above) whose model differs from its init's
        fit(load_config(config, [*scst, "model.decoder.dropout=0.3", f"train.init={xe}",
                                 f"train.out_dir={tmp_path / 'scst_dropout'}"]))


def test_scst_stage_needs_a_starting_checkpoint(tmp_path: Path) -> None:
    from captioner.training.fit import fit

    config = tiny_config("train.stage=scst", f"data.root={tmp_path / 'shapes'}", "data.shapes_num_train=4",
                         "data.shapes_num_val=2", "data.shapes_num_test=2", f"train.out_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match="train.init"):
        fit(config)


def test_validation_decodes_with_train_val_beam_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import captioner.training.fit as train

    torch.set_num_threads(1)
    beams: list[int] = []
    decode = train.caption_records

    def spy(*args, **kwargs):
        beams.append(kwargs["beam_size"])
        return decode(*args, **kwargs)

    monkeypatch.setattr(train, "caption_records", spy)
    config = tiny_config(f"data.root={tmp_path / 'shapes'}", "data.shapes_num_train=8", "data.shapes_num_val=4",
                         "data.shapes_num_test=2", "data.batch_size=8", "train.epochs=1", "train.val_beam_size=2",
                         "decode.max_length=6", f"train.out_dir={tmp_path / 'run'}")
    train.fit(config)
    assert beams == [2]  # the one validation of the epoch decoded with the configured beam
    # what the curves are drawn from
    assert (tmp_path / "run" / "metrics.csv").is_file() and (tmp_path / "run" / "step_losses.csv").is_file()


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.val_beam_size=0", r"'train.val_beam_size' must be a whole number in \[1, 100\]"),
        ("scst.baseline=best", "'scst.baseline' must be one of greedy, mean"),
        ("train.stage=rl", "'train.stage' must be one of xe, scst"),
        ("scst.samples=0", "'scst.samples' must be >= 1"),
        ("scst.temperature=0", "'scst.temperature' must be a finite number > 0"),
        ("scst.top_k=-1", "'scst.top_k' must be"),
        ("scst.top_p=0", "'scst.top_p' must be"),
        ("scst.bleu_weight=-1", "'scst.bleu_weight' must be >= 0"),
    ],
)
def test_scst_settings_are_validated(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(override)


def test_mean_baseline_needs_two_samples_and_some_reward() -> None:
    with pytest.raises(ConfigError, match="needs 'scst.samples' >= 2"):
        tiny_config("scst.baseline=mean", "scst.samples=1")
    with pytest.raises(ConfigError, match="both 0"):
        tiny_config("scst.cider_weight=0")
    assert tiny_config("scst.baseline=greedy", "scst.samples=1").scst.samples == 1


@pytest.mark.parametrize("baseline", ["greedy", "mean"])
def test_scst_suppress_bad_endings_keeps_samples_and_baseline_from_ending_on_a_listed_word(baseline: str) -> None:
    """With the LSTM's output biased towards "a" and <eos>, unconstrained samples end on "a";
    with scst.suppress_bad_endings neither the samples nor the greedy baseline ever do."""
    model = tiny_model().train()
    vocab = model.vocab
    with torch.no_grad():
        model.decoder.out_vocab.bias[vocab.index["a"]] += 6.0
        model.decoder.out_vocab.bias[vocab.eos_id] += 6.0
    for suppress in (False, True):
        torch.manual_seed(0)
        reward = Recorder(vocab.index["red"])
        settings = ScstConfig(samples=8, baseline=baseline, max_length=8, suppress_bad_endings=suppress)
        SelfCritical(settings, vocab, [], reward)(model, feature_batch(model), tiny_config(), encoded=True)
        scored = [caption for candidates, _ in reward.calls for caption in candidates]
        ends_on_a = [c[-2:] == [vocab.index["a"], vocab.eos_id] for c in scored]
        assert any(ends_on_a) != suppress, (suppress, scored[:4])
