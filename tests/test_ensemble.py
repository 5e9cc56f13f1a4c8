"""Ensembles: members' probabilities averaged at every step behind the decoder interface; one
member is that model, two copies too; different encoders, the CLI and evaluate()."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_config, tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.core.errors import CheckpointError, ConfigError
from captioner.data.datasets import load_split
from captioner.evaluation.evaluate import caption_records, evaluate
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config, save_checkpoint
from captioner.models.ensemble import Ensemble, EnsembleDecoder
from captioner.text.vocab import Vocabulary

MODES = {  # name -> decoding options
    "greedy": {"beam_size": 1},
    "beam": {"beam_size": 3, "n_best": 2},
    "diverse beam": {"beam_size": 4, "diverse_groups": 2, "n_best": 2},
    "sampling": {"sample": True, "n_best": 3, "seed": 0},
    "constrained": {"beam_size": 3, "min_length": 3, "suppress_bad_endings": True},
}


def pictures(count: int = 3) -> list[Image.Image]:
    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 256, (20 + 7 * i, 30, 3), dtype=np.uint8)) for i in range(count)]


def n_best(model: Captioner | Ensemble, options: dict) -> list[list]:
    images = torch.stack([model.transform(p) for p in pictures()])  # one model: (B, 3, S, S); an ensemble: (B, P)
    options = dict(options)
    return model.caption(images, n_best=options.pop("n_best", 1), max_length=8, **options)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("mode", MODES)
def test_an_ensemble_of_one_is_the_model(kind: str, mode: str) -> None:
    model = tiny_model(f"model.decoder.type={kind}")
    alone, ensembled = n_best(model, MODES[mode]), n_best(Ensemble([model]), MODES[mode])
    assert [[(c.tokens, c.score, c.logprob, c.finished) for c in hyps] for hyps in ensembled] == \
        [[(c.tokens, c.score, c.logprob, c.finished) for c in hyps] for hyps in alone]
    for hyps_a, hyps_e in zip(alone, ensembled):  # the map is the mean over layers and heads
        for a, e in zip(hyps_a, hyps_e):
            assert torch.allclose(e.heatmaps(), a.attn.mean(dim=(1, 2)), atol=1e-6)


@pytest.mark.parametrize("mode", ["greedy", "beam", "diverse beam"])
def test_an_ensemble_of_two_copies_is_the_model(mode: str) -> None:
    model = tiny_model()
    alone, ensembled = n_best(model, MODES[mode]), n_best(Ensemble([model, model]), MODES[mode])
    assert [[c.tokens for c in hyps] for hyps in ensembled] == [[c.tokens for c in hyps] for hyps in alone]
    assert [c.score for hyps in ensembled
            for c in hyps] == pytest.approx([c.score for hyps in alone for c in hyps], abs=1e-5)


def different_members() -> tuple[Captioner, Captioner]:
    """Two tiny models with one vocabulary and different encoders and decoders: an LSTM on 32 px
    images (a 2x2 grid of 64 features), a transformer on 48 px images (3x3 of 96)."""
    lstm = tiny_model(seed=0)
    transformer = tiny_model("model.decoder.type=transformer", "data.image_size=48", "model.encoder.width=12", seed=1)
    return lstm, transformer


@pytest.mark.parametrize("combine", ["prob", "logprob"])
def test_each_step_combines_the_members_by_hand(combine: str) -> None:
    """The ensemble's log-probabilities, step after step along a caption, are the log of the mean
    of the members' probabilities (prob), or the renormalised mean of their log-probabilities
    (logprob), each member reading its own encoding of the picture."""
    members = different_members()
    ensemble = Ensemble(members, combine=combine)
    picture = pictures(1)[0]
    prefix = [ensemble.vocab.bos_id, *ensemble.vocab.encode("a red circle left of")[1:-1]]
    with torch.no_grad():
        feats, _ = ensemble.encode(ensemble.transform(picture)[None])  # (1, sum N_i*D_i)
        memory = ensemble.decoder.prepare(feats)
        state = ensemble.decoder.init_state(memory, capacity=8)
        by_hand = []
        for member in members:
            member_feats, _ = member.encode(member.transform(picture)[None])  # (1, N_i, D_i)
            member_memory = member.decoder.prepare(member_feats)
            member_state = member.decoder.init_state(member_memory, capacity=8)
            steps = []
            for word in prefix:
                logprobs, _, member_state = member.decoder.step(member_memory, torch.tensor([word]), member_state)
                steps.append(logprobs[0])
            by_hand.append(torch.stack(steps))  # (T, V)
        for t, word in enumerate(prefix):
            logprobs, attn, state = ensemble.decoder.step(memory, torch.tensor([word]), state)
            if combine == "prob":
                expected = ((by_hand[0][t].exp() + by_hand[1][t].exp()) / 2).log()  # (V,)
            else:
                expected = ((by_hand[0][t] + by_hand[1][t]) / 2).log_softmax(dim=-1)  # (V,)
            assert torch.allclose(logprobs[0], expected, atol=1e-5)
            assert not torch.allclose(logprobs[0], by_hand[0][t], atol=1e-3)
            assert attn.shape == (1, 1, 1, 4)  # different grids (2x2 and 3x3): the first member's map


def test_teacher_forcing_equals_stepping() -> None:
    ensemble = Ensemble(different_members())
    tokens = torch.tensor([[ensemble.vocab.bos_id, *ensemble.vocab.encode("a red circle")[1:-1]]])  # (1, T)
    with torch.no_grad():
        feats, _ = ensemble.encode(ensemble.transform(pictures(1)[0])[None])
        forced = ensemble.decoder(feats, tokens).logits[0]  # (T, V)
        memory = ensemble.decoder.prepare(feats)
        state = ensemble.decoder.init_state(memory, capacity=8)
        for t in range(tokens.shape[1]):
            logprobs, _, state = ensemble.decoder.step(memory, tokens[:, t], state)
            assert torch.allclose(forced[t], logprobs[0], atol=1e-5)


def test_an_ensemble_of_different_models_decodes_differently_from_each() -> None:
    """Each member prefers its own word a little over "circle" (probabilities about 0.6 and
    0.4), and "circle" over the rest by far: each writes its own word, and the ensemble, whose
    mean probability of "circle" is the highest, writes "circle"."""
    lstm, transformer = different_members()
    vocab = lstm.vocab
    with torch.no_grad():
        for layer, word in ((lstm.decoder.out_vocab, "red"), (transformer.decoder.out, "blue")):
            layer.weight.zero_()  # the output is the bias alone, whatever the image and the words before
            layer.bias.zero_()
            layer.bias[vocab.index[word]] = 20.0 + math.log(0.6)
            layer.bias[vocab.index["circle"]] = 20.0 + math.log(0.4)
    texts = {}
    for name, model in (("lstm", lstm), ("transformer", transformer), ("ensemble", Ensemble([lstm, transformer]))):
        texts[name] = {hyps[0].text for hyps in n_best(model, MODES["beam"])}
    assert texts == {"lstm": {"red " * 7 + "red"}, "transformer": {"blue " * 7 + "blue"},
                     "ensemble": {"circle " * 7 + "circle"}}
    for hyps in n_best(Ensemble([lstm, transformer]), MODES["greedy"]):
        assert hyps[0].attn.shape[1:] == (1, 1, 2, 2)  # the first member's grid


def test_each_member_gets_the_picture_resized_for_it() -> None:
    members = different_members()
    ensemble = Ensemble(members)
    picture = pictures(1)[0]
    parts = ensemble.transform.split(ensemble.transform(picture)[None])
    assert [p.shape for p in parts] == [(1, 3, 32, 32), (1, 3, 48, 48)]
    for member, part in zip(members, parts):
        assert torch.equal(part[0], member.transform(picture))
    feats, grid = ensemble.encode(ensemble.transform(picture)[None])
    assert feats.shape == (1, 4 * 64 + 9 * 96) and grid == (2, 2)  # a 2x2 grid of 64 and a 3x3 grid of 96 features


def test_members_with_different_vocabularies_are_refused_in_one_line(tmp_path: Path) -> None:
    model = tiny_model()
    other_words = Vocabulary([*model.vocab.words[:6], "zebra", *model.vocab.words[7:]])
    shorter = Vocabulary(model.vocab.words[:-1])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "a.pt", model)
    save_checkpoint(tmp_path / "b.pt", Captioner.from_config(tiny_config(), other_words))
    save_checkpoint(tmp_path / "c.pt", Captioner.from_config(tiny_config(), shorter))
    for other, detail in (("b.pt", "'zebra'"), ("c.pt", "18 vs 17 words")):
        with pytest.raises(CheckpointError) as info:
            Ensemble.from_pretrained([tmp_path / "a.pt", tmp_path / other], "cpu")
        message = str(info.value)
        assert ("\n" not in message and str(tmp_path / "a.pt") in message and str(tmp_path / other) in message
                and detail in message)
    with pytest.raises(ConfigError, match="combine"):
        Ensemble([model], combine="max")
    with pytest.raises(ConfigError, match="size"):
        EnsembleDecoder([model.decoder, Captioner.from_config(tiny_config(), shorter).decoder], [(4, 8), (4, 8)])


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    a, b = different_members()
    save_checkpoint(tmp_path / "a.pt", a)
    save_checkpoint(tmp_path / "b.pt", b)
    images = []
    for i, picture in enumerate(pictures()):
        images.append(tmp_path / f"image{i}.png")
        picture.save(images[-1])
    return tmp_path / "a.pt", tmp_path / "b.pt", images


def test_cli_captions_with_an_ensemble(two_checkpoints, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, images = two_checkpoints
    for combine in ("prob", "logprob"):
        assert main(["caption", str(a), *map(str, images), "--ensemble", str(b), "--combine", combine,
                     "--device", "cpu", "--json", "--beam", "2", "--max-length", "6"]) == 0
        rows = json.loads(capsys.readouterr().out)
        expected = Ensemble.from_pretrained([a, b], "cpu", combine).caption(images, beam_size=2, max_length=6)
        assert [(r["caption"], r["score"]) for r in rows] == [(c.text, round(c.score, 4)) for c in expected]
    refusals = [
        [str(images[0]), "--combine", "logprob"],  # without --ensemble
        [str(images[0]), "--ensemble", str(b), "--self-attention", "out"],
    ]
    for args in refusals:
        assert main(["caption", str(a), *args, "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: caption:") and len(err.splitlines()) == 1
    # an image after the members is an image, not a member
    assert main(["caption", str(a), str(images[0]), "--ensemble", str(b), str(images[1]), "--device", "cpu"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [str(images[0]), str(images[1])]


def test_evaluate_takes_an_ensemble(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from captioner.data.shapes import generate_shapes

    generate_shapes(tmp_path / "shapes", 0, 0, 3, image_size=32, progress=False)
    overrides = (f"data.root={tmp_path / 'shapes'}", "decode.max_length=6")
    for name, seed in (("a", 0), ("b", 1)):
        (tmp_path / name).mkdir()
        save_checkpoint(tmp_path / name / "best.pt", tiny_model(*overrides, seed=seed), tiny_config(*overrides))
    ensemble = Ensemble.from_pretrained([tmp_path / "a", tmp_path / "b"], "cpu")
    records = load_split(checkpoint_config(tmp_path / "a").data, "test")
    evaluation = evaluate(ensemble, records, official=False, beam_size=2, progress=False)
    by_image = ensemble.caption([r.path for r in records], beam_size=2)
    assert evaluation.predictions == {r.image_id: c.text for r, c in zip(records, by_image)}
    with pytest.raises(ConfigError, match="ensemble"):
        caption_records(ensemble, records, features=torch.zeros(3, 4, 8), grid=(2, 2))

    # saved outside a run folder, as someone else's checkpoint: its dataset is named
    assert main(["evaluate", str(tmp_path / "a"), "--ensemble", str(tmp_path / "b"), "--split", "test", "--fast",
                 "--beam", "2", "--json", "--device", "cpu", f"data.root={tmp_path / 'shapes'}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ensemble"] == [str(tmp_path / "a" / "best.pt"), str(tmp_path / "b")]
    written = json.loads((tmp_path / "a" / "ensemble_b" / "results_test.json").read_text())
    assert {r["image_id"]: r["caption"] for r in written} == evaluation.predictions
    assert not (tmp_path / "a" / "results_test.json").exists()  # the first member's own results are left alone
    assert main(["evaluate", str(tmp_path / "a"), "--ensemble", str(tmp_path / "b"), "--features", str(tmp_path / "f"),
                 "--fast"]) == 2
    assert "ensemble" in capsys.readouterr().err


def test_an_ensemble_encodes_a_split_once_and_decodes_it_several_ways(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """encode_records packs each member's features, so compare_decoding's variants (the length
    penalty tuned on dev) work for an ensemble: each variant's captions are evaluate()'s."""
    from captioner.data.shapes import generate_shapes
    from captioner.evaluation.evaluate import decode_variants, encode_records

    generate_shapes(tmp_path / "shapes", 0, 0, 3, image_size=32, progress=False)
    overrides = (f"data.root={tmp_path / 'shapes'}", "decode.max_length=6")
    paths = []
    for name, seed, kind in (("a", 0, "lstm"), ("b", 1, "transformer")):
        paths.append(tmp_path / f"{name}.pt")
        decoder = (*overrides, f"model.decoder.type={kind}")
        save_checkpoint(paths[-1], tiny_model(*decoder, seed=seed), tiny_config(*decoder))
    ensemble = Ensemble.from_pretrained(paths, "cpu")
    records = load_split(checkpoint_config(paths[0]).data, "test")
    encoded = encode_records(ensemble, records, progress=False)
    assert encoded.features.shape == (len(records), ensemble.packed_width)  # packed: one row per image
    variants = {f"alpha {a}": {"beam_size": 2, "length_penalty": a} for a in (0.0, 2.0)}
    for variant in decode_variants(ensemble, encoded, variants, official=False):
        expected = evaluate(ensemble, records, official=False, progress=False, **variants[variant.name]).predictions
        assert {i: c.text for i, c in variant.captions.items()} == expected
    with pytest.raises(ConfigError, match="ensemble"):  # features of another shape are still one encoder's
        caption_records(ensemble, records, features=encoded.features[:, :-1], grid=encoded.grid)

    compare_decoding = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "compare_decoding.py"))["main"]
    # the flags reach load_model
    assert compare_decoding([str(paths[0]), "--combine", "logprob", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: compare_decoding: --combine applies only with --ensemble"
