"""One decoding contract: every option is declared once (core/decode_schema.py), and a bad value
gets the same words from the config, the library, the command line and the demo (the ONNX
runtime's side is in test_onnx.py, where an export exists)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from captioner.apps.arguments import decode_value
from captioner.apps.cli import build_parser
from captioner.apps.demo.page import MAX_BEAM, MAX_LENGTH, served
from captioner.core.config import load_config
from captioner.core.config_sections import Config, DecodeConfig
from captioner.core.decode_schema import OPTIONS, check_options, combination_problem
from captioner.core.errors import ConfigError, RequestError
from captioner.models.decoding import DecodeOptions

WRONG_TYPE = {int: 2.5, float: "fast", bool: 1}


def bad_values(name: str) -> list[Any]:
    """A value of the wrong type, one just outside the limits, and for numbers NaN."""
    option = OPTIONS[name]
    values = [WRONG_TYPE[option.kind]]
    if option.outside(option.kind) is not None:
        values.append(option.outside(option.kind))
    if option.kind is not bool:
        values.append(math.nan)
    return values


CASES = [(name, value) for name in OPTIONS for value in bad_values(name)]


def test_the_schema_is_the_library_options_and_the_config_section() -> None:
    assert [f.name for f in dataclasses.fields(DecodeOptions)] == list(OPTIONS)
    assert DecodeOptions() == DecodeOptions(**{name: option.default for name, option in OPTIONS.items()})
    for f in dataclasses.fields(DecodeConfig):
        if f.name in ("batch_size", "cuda_graphs"):  # how many images decode together, and on what: not choices of how
            continue
        assert f.metadata["spec"] is OPTIONS[f.name] and f.default == OPTIONS[f.name].default, f.name
    # the other keys that hold a decoding option are judged by it too
    sections = {f.name: f for f in dataclasses.fields(Config().train)} | {f"scst.{f.name}": f
                                                                          for f in dataclasses.fields(Config().scst)}
    assert sections["val_beam_size"].metadata["spec"] is OPTIONS["beam_size"]
    assert sections["scst.max_length"].metadata["spec"] is OPTIONS["max_length"]
    assert sections["scst.temperature"].metadata["spec"] is OPTIONS["temperature"]
    assert (sections["scst.top_k"].metadata["spec"] is OPTIONS["top_k"]
            and sections["scst.top_p"].metadata["spec"] is OPTIONS["top_p"])


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_the_library_refuses_in_the_schemas_words(name: str, value: Any) -> None:
    refusal = OPTIONS[name].refusal(value)
    assert refusal.startswith(f"{name} must be ") and refusal.endswith(f"; got {value!r}")
    with pytest.raises(ConfigError) as error:
        DecodeOptions(**{name: value})
    assert str(error.value) == f"decode: {refusal}"


CONFIG_KEYS = [f.name for f in dataclasses.fields(DecodeConfig) if f.name != "batch_size"]


CONFIG_CASES = [c for c in CASES if c[0] in CONFIG_KEYS]


@pytest.mark.parametrize(("name", "value"), CONFIG_CASES, ids=[f"{n}={v!r}" for n, v in CONFIG_CASES])
def test_the_config_refuses_in_the_same_words(name: str, value: Any, tmp_path) -> None:
    """From an override and from a YAML file: the key, then the schema's words."""
    text = (".nan" if isinstance(value, float) and math.isnan(value) else repr(value) if isinstance(value, str)
            else str(value).lower())
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"decode.{name}={text}"])
    assert str(error.value) == f"command line: 'decode.{name}' {OPTIONS[name].refusal(value).split(' ', 1)[1]}"
    path = tmp_path / "bad.yaml"
    path.write_text(f"decode:\n  {name}: {text}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: 'decode.{name}' {OPTIONS[name].refusal(value).split(' ', 1)[1]}"


FLAGS = {
    "--beam": "beam_size", "--max-length": "max_length", "--min-length": "min_length",
    "--length-penalty": "length_penalty",
    "--diverse-groups": "diverse_groups", "--diversity-strength": "diversity_strength", "--n-best": "n_best",
    "--temperature": "temperature", "--top-k": "top_k", "--top-p": "top_p", "--seed": "seed",
}


@pytest.mark.parametrize("flag", FLAGS)
def test_every_flag_refuses_in_the_same_words(flag: str, capsys: pytest.CaptureFixture) -> None:
    name = FLAGS[flag]
    option = OPTIONS[name]
    text = str(option.outside(option.kind))
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["caption", "model.pt", "photo.jpg", flag, text])
    assert stopped.value.code == 2
    assert f"argument {flag}: {option.refusal(option.kind(text))}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # not a number at all
        build_parser().parse_args(["caption", "model.pt", "photo.jpg", flag, "many"])
    assert f"argument {flag}: {option.refusal('many')}" in capsys.readouterr().err
    # the default passes
    assert decode_value(name)(str(option.default if option.default is not None else 7)) is not None


def test_the_flags_help_states_the_limits(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["caption", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "beam width, a whole number in [1, 100]" in help_text
    assert "a finite number in (0, 1]" in help_text  # --top-p


@pytest.mark.parametrize(("name", "value"),
                         [("beam_size", 11), ("beam_size", 0), ("beam_size", 2.5), ("beam_size", True),
                                             ("beam_size", "3"), ("max_length", 61), ("max_length", math.inf)])
def test_the_demo_refuses_in_the_same_words_within_what_it_serves(name: str, value: Any) -> None:
    with pytest.raises(RequestError) as error:
        served(name, value)
    assert str(error.value) == OPTIONS[name].refusal(value, served=True)
    assert str(error.value).startswith(f"{name} must be a whole number in [1, ")


def test_the_demo_serves_a_part_of_what_the_library_allows() -> None:
    assert (MAX_BEAM, MAX_LENGTH) == (OPTIONS["beam_size"].served.le, OPTIONS["max_length"].served.le)
    assert MAX_BEAM < OPTIONS["beam_size"].limits.le and MAX_LENGTH < OPTIONS["max_length"].limits.le
    assert served("beam_size", 3.0) == 3 and type(served("beam_size", 3.0)) is int  # a slider's float
    DecodeOptions(beam_size=MAX_BEAM + 1)  # the library goes further than the page


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"beam_size": 4, "diverse_groups": 3}, "beam_size (4) must be a multiple of diverse_groups (3)"),
        ({"beam_size": 3, "n_best": 5}, "n_best (5) must not exceed beam_size (3); raise the beam or sample"),
        ({"min_length": 9, "max_length": 8}, "min_length (9) must not exceed max_length (8)"),
        ({"beam_size": 3, "n_best": 5, "sample": True}, None),  # draws: no beam to exceed
        ({"beam_size": 4, "diverse_groups": 2, "n_best": 4, "min_length": 8, "max_length": 8}, None),
    ],
)
def test_the_rules_between_options_are_one_text_everywhere(values: dict, problem: str | None) -> None:
    assert combination_problem(values) == problem
    if problem is None:
        check_options(values)
        DecodeOptions(**values)
        return
    with pytest.raises(ConfigError) as error:
        DecodeOptions(**values)
    assert str(error.value) == f"decode: {problem}"
    config_values = {k: v for k, v in values.items() if k in CONFIG_KEYS}
    if len(config_values) == len(values):
        with pytest.raises(ConfigError) as error:
            load_config(None, [f"decode.{k}={v}" for k, v in config_values.items()])
        assert str(error.value) == f"command line: decode: {problem}"  # the overrides brought it, not the defaults


def test_the_longest_caption_at_the_largest_length_penalty_ranks_with_a_finite_penalty() -> None:
    """The length penalty is a float power of the caption's length: without an upper limit on alpha, a value the
    schema let through overflowed in every search (OverflowError, a traceback) once the captions grew."""
    from captioner.core.decode_results import length_penalty

    alpha, longest = OPTIONS["length_penalty"].limits.le, OPTIONS["max_length"].limits.le
    assert math.isfinite(length_penalty(longest, alpha)) and length_penalty(longest, alpha) > length_penalty(1, alpha)


def test_the_docs_table_is_the_schema() -> None:
    from pathlib import Path

    from captioner.core.decode_schema import markdown_table

    docs = (Path(__file__).parents[1] / "docs" / "library.md").read_text()
    assert markdown_table() in docs, (
        "docs/library.md: paste captioner.core.decode_schema.markdown_table() into 'Decoding options'")


@pytest.mark.parametrize(("flag", "name"), [("--beam", "beam_size"), ("--max-length", "max_length")])
def test_the_runtimes_command_line_refuses_in_the_same_words(flag: str, name: str,
                                                             capsys: pytest.CaptureFixture) -> None:
    """`python -m captioner.deploy` parses its decoding flags through the schema, as `captioner caption` does."""
    from captioner.deploy.__main__ import parse_arguments

    option = OPTIONS[name]
    for text, shown in ((str(option.outside(option.kind)), option.outside(option.kind)), ("many", "many"),
                        ("2.5", "2.5")):
        with pytest.raises(SystemExit) as stopped:
            parse_arguments(["export/", "photo.jpg", flag, text])
        assert stopped.value.code == 2
        assert f"argument {flag}: {option.refusal(shown)}" in capsys.readouterr().err
    assert getattr(parse_arguments(["export/", "photo.jpg", flag, "4"]), flag.lstrip("-").replace("-", "_")) == 4


@pytest.mark.parametrize(
    ("names", "allowed", "where", "message"),
    [
        (["beams"], OPTIONS, "", r"^decode: unknown option 'beams' \(did you mean 'beam_size'\?\)$"),
        (["colour"], OPTIONS, "",
         r"^decode: unknown option 'colour' \(options: beam_size, max_length, .*self_attention\)$"),
        (["temperature"], ("beam_size", "max_length"), " for the ONNX runtime",
         r"^decode: unknown option 'temperature' for the ONNX runtime \(options: beam_size, max_length\)$"),
    ],
)
def test_an_unknown_option_is_one_text_with_a_hint(names: list, allowed, where: str, message: str) -> None:
    from captioner.core.decode_schema import check_names

    with pytest.raises(ConfigError, match=message):
        check_names(names, allowed, where)
    with pytest.raises(ConfigError, match=message.replace(" for the ONNX runtime", "")):
        check_options({name: 1 for name in names}) if allowed is OPTIONS else check_names(names, allowed)


def test_the_searches_and_the_samplers_rules_are_the_schemas() -> None:
    """A search asks the schema its own rules even for options made for sampling; a direct call
    of SCST's sampler is judged as DecodeOptions judges its values: ConfigError, the same words."""
    from captioner.core.decode_schema import check_search
    from captioner.models.decoding.sampling import check_sampling

    with pytest.raises(ConfigError, match=r"^decode: beam_size \(4\) must be a multiple of diverse_groups \(3\)$"):
        check_search({"beam_size": 4, "diverse_groups": 3, "n_best": 1, "sample": True})
    check_search({"beam_size": 4, "diverse_groups": 2, "n_best": 4})
    for values in ({"temperature": 0.0}, {"top_k": -1}, {"top_p": 1.5}):
        arguments = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **values}
        with pytest.raises(ConfigError) as error:
            check_sampling(**arguments)
        with pytest.raises(ConfigError) as expected:
            DecodeOptions(sample=True, **values)
        assert str(error.value) == str(expected.value)
