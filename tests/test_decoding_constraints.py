"""min_length and bad-ending suppression: the same rule in greedy decoding, beam search (plain
and diverse), sampling and the SCST roll-out; off, decoding is what it was."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.core.config_sections import DecodeConfig
from captioner.core.errors import ConfigError
from captioner.models.checkpoint import save_checkpoint
from captioner.models.decoder import Decoder, Memory, State
from captioner.models.decoding import DecodeOptions, Hypothesis, SpecialTokens, beam_search, decode_hypotheses
from captioner.models.decoding.rules import EndingRule
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder
from captioner.models.decoding.sampling import sample_captions
from captioner.text.vocab import BAD_ENDINGS

# A vocabulary of 8 ids: <pad>, <bos>, <eos>, <unk>, then "a" (a bad ending), "red", "circle", "square".
PAD, BOS, EOS, UNK, A, RED, CIRCLE, SQUARE = range(8)
SPECIAL = SpecialTokens(BOS, EOS, (PAD, BOS, UNK), bad_endings=(A,))


class ScriptedDecoder(Decoder):
    """A decoder whose next word depends on the previous word only, by a fixed table of logits:
    its favourite caption is "red a" (two words, ending on an article); after "a" the next best
    is "circle", after "circle" it is "square"."""

    def __init__(self) -> None:
        super().__init__()
        logits = torch.zeros(8, 8)  # (prev, next)
        logits[:, EOS] = 5.0  # every word but <bos> and "red" would rather end the caption
        logits[BOS, RED], logits[BOS, EOS] = 6.0, 2.0
        logits[RED, A], logits[RED, EOS] = 6.0, 3.0
        logits[A, CIRCLE] = 4.5
        logits[CIRCLE, SQUARE] = 4.0
        self.register_buffer("table", logits.log_softmax(dim=-1))
        self.vocab_size = 8

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"feats": feats}

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return {"steps": memory["feats"].new_zeros(memory["feats"].shape[0])}

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        R, N = memory["feats"].shape[:2]
        attn = memory["feats"].new_full((R, 1, 1, N), 1.0 / N)  # (R, 1, 1, N)
        return self.table[prev_tokens], attn, {"steps": state["steps"] + 1}  # (R, V)


MODES = {  # name -> the options of that decoding mode
    "greedy": {"beam_size": 1},
    "beam": {"beam_size": 3},
    "diverse beam": {"beam_size": 4, "diverse_groups": 2, "n_best": 4},
    "sampling": {"sample": True, "n_best": 16, "seed": 0},
}
FEATS = torch.zeros(2, 4, 3)  # (B, N, D): the scripted decoder ignores them


def decode(mode: str, **constraints) -> list[Hypothesis]:
    """Every hypothesis of every image in this mode, with these constraints."""
    options = DecodeOptions(max_length=6, **MODES[mode], **constraints)
    return [h for hyps in decode_hypotheses(ScriptedDecoder(), FEATS, SPECIAL, options) for h in hyps]


@pytest.mark.parametrize("mode", MODES)
def test_min_length_holds_in_every_mode(mode: str) -> None:
    assert any(h.finished and len(h.tokens) < 4 for h in decode(mode))  # unconstrained: it ends after 2 words
    constrained = decode(mode, min_length=4)
    assert all(len(h.tokens) >= 4 for h in constrained)
    assert any(h.finished for h in constrained)  # it still ends, once allowed


@pytest.mark.parametrize("mode", MODES)
def test_bad_endings_are_suppressed_in_every_mode(mode: str) -> None:
    assert any(h.finished and h.tokens[-1:] == [A] for h in decode(mode))  # unconstrained: "red a"
    constrained = decode(mode, suppress_bad_endings=True)
    assert not any(h.finished and h.tokens[-1:] == [A] for h in constrained)
    if mode in ("greedy", "beam"):
        assert constrained[0].tokens == [RED, A, CIRCLE]  # the next best caption, not a shorter one


@pytest.mark.parametrize("mode", MODES)
def test_a_caption_reaching_max_length_is_still_cut_there(mode: str) -> None:
    for h in decode(mode, min_length=6):
        assert len(h.tokens) == 6 and not h.finished


def test_scst_roll_outs_follow_the_same_rule() -> None:
    decoder = ScriptedDecoder()
    for constrained in (False, True):
        rule = {"max_length": 6, "min_length": 3 if constrained else 0, "suppress_bad_endings": constrained}
        sampled = sample_captions(decoder, FEATS, SPECIAL, DecodeOptions(sample=True, n_best=16, seed=0, **rule))
        greedy = sample_captions(decoder, FEATS, SPECIAL, DecodeOptions(**rule))
        for out in (sampled, greedy):
            rows = [row[: int(n)] for row, n in zip(out.tokens.tolist(), out.lengths)]  # words, then <eos> if ended
            short_or_bad = [row[-1:] == [EOS] and (len(row) - 1 < 3 or row[-2:-1] == [A]) for row in rows]
            assert any(short_or_bad) == (not constrained)
        assert greedy.tokens[0, :4].tolist() == ([RED, A, EOS, PAD] if not constrained else [RED, A, CIRCLE, EOS])


def best_allowed(decoder: Decoder, feat: torch.Tensor, min_length: int, bad: set[int], max_length: int) -> list[int]:
    """The most probable caption of words 3 and 4 (by teacher forcing, enumerating every one)
    that ends with at least min_length words and not on a word of `bad`; a caption cut off at
    max_length is always allowed."""
    best, best_logprob = [], float("-inf")
    ended = [(list(s), True) for n in range(max_length) for s in itertools.product([3, 4], repeat=n)]
    cut_off = [(list(s), False) for s in itertools.product([3, 4], repeat=max_length)]
    with torch.no_grad():
        for tokens, finished in ended + cut_off:
            if finished and (len(tokens) < min_length or (tokens and tokens[-1] in bad)):
                continue
            ids = torch.tensor([BOS, *tokens] + ([EOS] if finished else []))  # (T+1,) or (T+2,)
            logits = decoder(feat[None], ids[None, :-1]).logits[0]  # (T', V)
            logprob = float(logits.log_softmax(-1).gather(1, ids[1:, None]).sum())
            if logprob > best_logprob:
                best, best_logprob = tokens, logprob
    return best


@pytest.mark.parametrize(("min_length", "bad"), [(0, set()), (2, set()), (0, {3}), (3, {4})])
def test_constrained_beam_search_finds_the_best_allowed_caption(min_length: int, bad: set[int]) -> None:
    """With a beam holding every hypothesis, the constrained search is exact: it returns the most
    probable caption among those the constraints allow, found by enumeration."""
    torch.manual_seed(0)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 5, 6).eval()
    with torch.no_grad():
        decoder.out_vocab.weight.mul_(3.0)  # a peakier model: captions of different lengths compete
    feats = torch.randn(8, 4, 6)  # (B, N, D)
    special = SpecialTokens(BOS, EOS, (0, BOS), bad_endings=tuple(bad))
    options = DecodeOptions(beam_size=32, max_length=4, min_length=min_length, suppress_bad_endings=bool(bad))
    found = [h.tokens for h in beam_search(decoder, feats, special, options)]
    assert found == [best_allowed(decoder, feat, min_length, bad, max_length=4) for feat in feats]
    if min_length or bad:  # the constraint changed some winner
        unconstrained = [h.tokens
                         for h in beam_search(decoder, feats, special, DecodeOptions(beam_size=32, max_length=4))]
        assert found != unconstrained


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_without_constraints_greedy_decoding_is_the_plain_argmax_loop(kind: str) -> None:
    """Off (the default), greedy decoding is the argmax of each step's log-probabilities with the
    banned ids masked, written out here independently of the decoding module."""
    model = tiny_model(f"model.decoder.type={kind}", "decode.max_length=8")
    feats, grid = model.encode(torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8))  # (B, N, D)
    special, decoder = model.special_tokens, model.decoder
    expected = []
    with torch.no_grad():
        for feat in feats:
            memory = decoder.prepare(feat[None])
            state = decoder.init_state(memory, capacity=8)
            prev, tokens = torch.tensor([special.bos]), []
            for _ in range(8):
                logprobs, _, state = decoder.step(memory, prev, state)
                logprobs[0, list(special.banned)] = float("-inf")
                prev = logprobs.argmax(dim=-1)
                if int(prev) == special.eos:
                    break
                tokens.append(int(prev))
            expected.append(tokens)
    assert [c.tokens for c in model.decode(feats, grid, beam_size=1)] == expected


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mode", MODES)
def test_a_rule_that_never_fires_changes_nothing(kind: str, mode: str) -> None:
    """Suppression with no bad-ending id in the vocabulary leaves every caption and score as
    decoding without it: the rule touches <eos> after those words and nothing else."""
    model = tiny_model(f"model.decoder.type={kind}")
    feats, _ = model.encode(torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8))  # (B, N, D)
    options = DecodeOptions(max_length=8, **MODES[mode])
    plain = decode_hypotheses(model.decoder, feats, model.special_tokens, options)
    # no bad endings
    special = SpecialTokens(model.special_tokens.bos, model.special_tokens.eos, model.special_tokens.banned)
    suppressed = decode_hypotheses(model.decoder, feats, special,
                                   DecodeOptions(max_length=8, suppress_bad_endings=True, **MODES[mode]))
    assert [[(h.tokens, h.score) for h in hyps] for hyps in suppressed] == [[(h.tokens, h.score) for h in hyps]
                                                                            for hyps in plain]


def test_special_tokens_carry_the_vocabulary_bad_endings() -> None:
    model = tiny_model()
    bad = model.special_tokens.bad_endings
    assert sorted(model.vocab.words[i] for i in bad) == sorted(w for w in model.vocab.words
                                                               if w in BAD_ENDINGS) == ["a", "of"]


@pytest.mark.parametrize(
    ("options", "named"),
    [({"min_length": -1}, "min_length"), ({"min_length": 9, "max_length": 8}, "min_length"),
     ({"min_length": 2.5}, "min_length"), ({"suppress_bad_endings": "yes"}, "suppress_bad_endings")],
)
def test_bad_constraint_options_are_one_line_errors(options: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        DecodeOptions(**options)
    assert "\n" not in str(info.value)


def test_the_config_section_sets_the_constraints() -> None:
    options = DecodeOptions.from_config(DecodeConfig(min_length=3, suppress_bad_endings=True))
    assert (options.min_length, options.suppress_bad_endings) == (3, True)
    model = tiny_model("decode.min_length=5", "decode.suppress_bad_endings=true", "decode.max_length=8")
    assert model.decode_options().min_length == 5 and model.decode_options(min_length=0).min_length == 0
    with pytest.raises(ConfigError, match="min_length"):
        model.decode_options(max_length=4)  # the section's min_length 5 no longer fits


def eos_loving_model(**extra: float):
    """A tiny LSTM whose output layer prefers <eos> (by 10) over "a" (by 5) over every other
    word: unconstrained it writes empty captions."""
    model = tiny_model("decode.max_length=6")
    vocab = model.vocab
    with torch.no_grad():
        model.decoder.out_vocab.bias[vocab.eos_id] += 10.0
        model.decoder.out_vocab.bias[vocab.index["a"]] += 5.0
    return model


def test_model_caption_takes_the_constraints(tmp_path: Path) -> None:
    model = eos_loving_model()
    picture = Image.fromarray(np.full((20, 24, 3), 90, dtype=np.uint8))
    assert model.caption(picture).words == []
    assert model.caption(picture, min_length=2).words == ["a", "a"]
    cut = model.caption(picture, min_length=2, suppress_bad_endings=True)  # "a" again and again, cut at max_length
    assert cut.words == ["a"] * 6 and not cut.finished


def test_cli_constraint_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_checkpoint(tmp_path / "model.pt", eos_loving_model())
    image = tmp_path / "image.png"
    Image.fromarray(np.full((20, 24, 3), 90, dtype=np.uint8)).save(image)
    base = ["caption", str(tmp_path / "model.pt"), str(image), "--device", "cpu", "--json"]
    for flags, words, finished in [([], [], True), (["--min-length", "2"], ["a", "a"], True),
                                   (["--min-length", "2", "--no-bad-endings", "--beam", "1"], ["a"] * 6, False)]:
        assert main([*base, *flags]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        assert row["caption"].split() == words and row["finished"] is finished
    assert main([*base, "--min-length", "7"]) == 2  # more than the checkpoint's max_length 6
    err = capsys.readouterr().err.strip()
    assert "min_length" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit):
        main([*base, "--min-length", "-1"])


def test_cli_length_penalty_reaches_the_beam_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_checkpoint(tmp_path / "model.pt", eos_loving_model())
    image = tmp_path / "image.png"
    Image.fromarray(np.full((20, 24, 3), 90, dtype=np.uint8)).save(image)
    base = ["caption", str(tmp_path / "model.pt"), str(image), "--device", "cpu", "--json", "--min-length", "2"]
    scores = {}
    for alpha in ("0", "1"):
        assert main([*base, "--length-penalty", alpha]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        assert row["caption"].split() == ["a", "a"]
        scores[alpha] = row["score"]
    # the same hypothesis, ranked by log-probability / ((5 + words) / 6) with its 2 words
    assert scores["0"] / scores["1"] == pytest.approx((5 + 2) / 6, rel=1e-4)
    for bad in ("-1", "inf", "short"):
        with pytest.raises(SystemExit):
            main([*base, "--length-penalty", bad])
        assert "--length-penalty" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_the_rule_reads_nothing_back_from_the_device(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SCST roll-outs run a fixed number of steps and never wait on the device; with both
    constraints on they still do not (counted by test_sync's simulated device)."""
    from test_sync import DeviceSimulation, watch_reads

    model = tiny_model(f"model.decoder.type={kind}")
    feats, _ = model.encode(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))  # (B, N, D)
    special = model.special_tokens
    ending = EndingRule.build(special, 3, True, model.decoder.vocab_size, feats.device)
    assert ending is not None and ending.bad_after is not None
    sim = DeviceSimulation()
    watch_reads(sim, monkeypatch)
    with sim, torch.no_grad():
        sim.mark(*model.parameters(), *model.buffers(), feats, ending.eos_column, ending.bad_after)
        rule = {"max_length": 6, "min_length": 3, "suppress_bad_endings": True}
        sample_captions(model.decoder, feats, special, DecodeOptions(sample=True, n_best=2, **rule))
        sample_captions(model.decoder, feats, special, DecodeOptions(**rule))  # the greedy baseline
    assert sim.syncs == []
