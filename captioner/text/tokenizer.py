"""The caption tokenizer: the official COCO evaluation's tokenisation, in pure Python. It reproduces CoreNLP
3.4.1's PTBTokenizer and pycocoevalcap's punctuation removal (`python -m benchmarks tokenizer` measures it)."""

from __future__ import annotations

import re

# Abbreviations whose period the PTB lexer keeps, each checked against it ("the st. x" -> "st.", "the tv. x" ->
# "tv"); its number-only ones (no., nos.) keep it only before a number, in `_keeps_period`.
ABBREVIATIONS = frozenset(
    """jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thurs fri
    ala ariz calif colo conn ct dak fla ga ind kan kans ky md mich minn mo mont neb nev okla penn tenn va vt
    wis wisc wyo inc co cos corp pty ptys pte ltd plc bancorp dept bhd assn univ intl sys ph tel est ext sq ft
    jr sr bros blvd rd esq mr mrs ms dr drs prof profs sen sens rep reps atty attys lt col gen messrs gov govs
    adm rev maj sgt cpl pvt capt st ste ave pres lieut hon brig cmdr comdr pfc spc supt supts det mt adj adv
    asst assoc ens insp mlle mme msgr sfc etc al seq vs bldg""".split()
)
# State abbreviations the lexer knows only capitalised ("Love La." but "la la.").
CAPITALISED_ABBREVIATIONS = frozenset("Az Ark Del Ill La Mass Miss Ore Pa Tex Wash".split())
# Capitalised words after which a capital single letter's period ends a sentence ("a P. The").
_SENTENCE_STARTS = frozenset("The A An This There It".split())

# Words the PTB lexer splits in two.
SPLIT_WORDS = {
    "cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"), "wanna": ("wan", "na"),
    "gimme": ("gim", "me"), "lemme": ("lem", "me"), "gotcha": ("got", "cha"), "'tis": ("'t", "is"),
    "'twas": ("'t", "was"), "y'all": ("y'", "all"),
}
BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
CONTRACTIONS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")

# Unicode quotes and apostrophes as the lexer reads them.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "`": "'"})

_W = r"[^\W_]"  # a letter or digit, any script
_TOKEN = re.compile(
    rf"""
    (?P<amp>&amp;)
    | (?P<word>
        '(?:\d0s|tis|twas|s|re|ve|ll|d|m)(?!{_W})          # '90s, 'tis, and a detached 's
        | (?<!{_W})[+-]\d+(?:[.,:]\d+)*                      # signed numbers: +9, -9
        | (?:{_W}|[_@])+
          (?: (?:[-/&']|(?<=\d)[.,:](?=\d)|\.(?={_W})) (?:{_W}|[_@])+ )*   # close-up, 1,000, x.y, o'clock
          '?                                                 # dunkin', dogs' (a quote: dropped later)
      )
    | (?P<marks>[?!]{{2,}})                                 # "!!", "?!" stay tokens
    | (?P<drop>[.?!,;:"'\-\u2013\u2014\u2026]+)             # sentence marks, quotes, dashes
    | (?P<other>\S)
    """,
    re.VERBOSE | re.IGNORECASE,
)
_ACRONYM = re.compile(r"[^\W\d_](?:\.[^\W_]+)+")  # t.v, u.s.a, e.g (a letter first: "2.00." is not one)
_NUMBER_NEXT = re.compile(r"\s*\d")
_TIME = re.compile(r"(\d+:\d+)([ap]m)")  # "5:30pm" -> "5:30 pm" (but "5pm" stays)
# An apostrophe inside a word joins it only in these shapes: a single letter before it
# ("o'clock", "d'angelo", not "i" or "y"), or vowels on both sides ("ma'am").
_APOSTROPHE_WORD = re.compile(r"[^\W\d_iy]'[^\W\d_]{2,}|[^\W\d_]*[aeiouy]'[aeiou][^\W\d_]*")


# Most captions are ASCII words and spaces, then perhaps a period, on the last word (COCO's) or after a space
# (Flickr's): their tokens are the words, split only as the lexer splits "cannot", and a period on the last word
# kept where `_keeps_period` says ("st.", a single letter).
_PLAIN = re.compile(r"([A-Za-z ]*[A-Za-z])(?:(\.)|\s+\.)?(\s*)")


def tokenize(text: str) -> list[str]:
    """Lower-case tokens of a caption, as pycocoevalcap's PTB tokenizer and punctuation removal give them."""
    text = text.translate(_QUOTES)
    if not text.isprintable():  # control and format characters are never a token (nor, so, a model's word)
        text = _unseen_removed(text)
    if (plain := _PLAIN.fullmatch(text)) is not None:
        return _plain_tokens(*plain.groups())
    return _lexed_tokens(text)


def _unseen_removed(text: str) -> str:
    """`text` with a soft hyphen deleted and every other character that prints nothing (a control character,
    a zero-width space or joiner, a direction mark) made a space, as the lexer treats them: white space stays."""
    return "".join(c if c.isprintable() or c.isspace() else "" if c == "\u00ad" else " " for c in text)


def _lexed_tokens(text: str) -> list[str]:
    """`tokenize` of any caption (its quotes translated), by the lexer's pattern."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text):
        kind, token = match.lastgroup, match.group()
        if kind == "word":
            word = token.lower()
            if text[match.end() : match.end() + 1] == "." and _keeps_period(token, text[match.end() + 1 :]):
                word += "."
            tokens += _split_word(word)
        elif kind == "amp":
            tokens.append("&")
        elif kind == "marks":
            tokens.append(token)
        elif kind == "other":
            tokens.append(BRACKETS.get(token, token.lower()))
    return tokens


def _plain_tokens(words: str, period: str | None, after: str) -> list[str]:
    """The tokens of ASCII `words` and spaces, then the `period` on the last word if any, then the white space
    `after`: what the lexer's pattern gives them, without running it."""
    tokens = words.lower().split()
    if period and _keeps_period(words.rsplit(None, 1)[-1], after):
        tokens[-1] += "."  # "st.": not a split word any more
        *rest, last = tokens
        return [*_split_words(rest), last]
    return _split_words(tokens)


def _split_words(tokens: list[str]) -> list[str]:
    """`tokens` with the lexer's split words ("cannot") in two."""
    if SPLIT_WORDS.keys().isdisjoint(tokens):
        return tokens
    return [part for token in tokens for part in SPLIT_WORDS.get(token, (token,))]


def _keeps_period(word: str, after: str) -> bool:
    """Whether the period after `word` (original case; `after`: the text past it) belongs to it: abbreviations,
    acronyms, single letters ("W. Bush", not "a P. The"), any before "," or ";"."""
    lower = word.lower()
    if after[:1] in (",", ";"):
        return True
    if len(word) == 1 and word.isalpha():
        following = after.split(None, 1)[0] if after[:1].isspace() and after.strip() else ""
        return not (word.isupper() and following in _SENTENCE_STARTS)
    if lower in ("no", "nos"):  # "no. 2": the lexer's abbreviations of "number"
        return bool(_NUMBER_NEXT.match(after))
    return lower in ABBREVIATIONS or word in CAPITALISED_ABBREVIATIONS or bool(_ACRONYM.fullmatch(lower))


def _split_word(word: str) -> list[str]:
    """Split contractions, times, the lexer's split words and inner apostrophes it does not keep ("po'boy")."""
    if word in SPLIT_WORDS:
        return list(SPLIT_WORDS[word])
    if "'" not in word and ":" not in word:
        return [word]  # the common case: nothing to split
    if word == "rock'n'roll":
        return ["rock", "'n'", "roll"]
    if time := _TIME.fullmatch(word):
        return list(time.groups())
    if not word.startswith("'") and not word.endswith(("dunkin'", "somethin'", "ol'")):
        word = word.rstrip("'")
    for suffix in CONTRACTIONS:
        if word.endswith(suffix) and len(word) > len(suffix):
            stem = word[: -len(suffix)]
            if suffix == "n't" or "'" not in stem:
                return [*_split_word(stem), suffix]
    inner = word.find("'", 1)
    if inner > 0 and not _APOSTROPHE_WORD.fullmatch(word) and not word.endswith("'"):
        return [*_split_word(word[:inner]), *_split_word(word[inner + 1 :])]
    return [word] if word else []
