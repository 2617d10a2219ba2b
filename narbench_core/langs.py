"""Language facts, in one place: which sacreBLEU tokenizer scores a target language, and whether its
lengths (words for the length ratio, stutter and statistics) count characters instead of
whitespace-separated words.

A language is an ISO 639-1 code, optionally with a region or script (``zh-Hans``, ``ja_JP``).
"""
from __future__ import annotations

# sacreBLEU's tokenizer per target language (as sacreBLEU's own command line picks it); others: 13a.
BLEU_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab"}
DEFAULT_BLEU_TOKENIZER = "13a"
# Languages written without spaces between words: lengths count characters (spaces excluded).
CHARACTER_LANGS = ("zh", "ja")


def base(lang: str) -> str:
    """``zh-Hans`` -> ``zh``; ``ja_JP`` -> ``ja``; lower case."""
    return lang.lower().split("-")[0].split("_")[0]


def bleu_tokenizer(target_lang: str) -> str:
    """The sacreBLEU tokenizer for a target language: ``zh``, ``ja-mecab``, else ``13a``."""
    return BLEU_TOKENIZERS.get(base(target_lang), DEFAULT_BLEU_TOKENIZER)


def counts_characters(lang: str) -> bool:
    """Whether lengths in ``lang`` count characters (Chinese, Japanese), not words."""
    return base(lang) in CHARACTER_LANGS


def text_length(text: str, lang: str) -> int:
    """Length in words (Chinese and Japanese: characters, spaces excluded)."""
    return len(text.replace(" ", "")) if counts_characters(lang) else len(text.split())
