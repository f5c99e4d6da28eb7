"""A small, working byte-level BPE tokenizer for synthetic GLM-5 checkpoints.

The Hugging Face `tokenizer.json` format is written by hand, so making a checkpoint needs neither
`tokenizers` nor `transformers`; both load the result (`tokenizers.Tokenizer.from_file`,
`transformers.PreTrainedTokenizerFast` / `AutoTokenizer`).

Design (ids are fixed and independent of the seed and of the model dims):
- ids 0..7: special tokens, GLM-style names. id 0 is BOS, id 1 is EOS (`<|endoftext|>`), matching the
  `bos_token_id` / `eos_token_id` written into config.json;
- ids 8..263: the 256 byte tokens in GPT-2's byte-to-unicode alphabet, so every UTF-8 string
  encodes and decodes losslessly;
- then up to `max_merges` merges, learned greedily from the small built-in English text below
  (deterministic: ties go to the lexicographically smallest pair).

The whole vocabulary is about 500 tokens, below every config's vocab_size (1024 for the small preset).
"""
from __future__ import annotations

import collections
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|startoftext|>",  # 0: BOS
    "<|endoftext|>",  # 1: EOS (also the pad token)
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
)
BOS_TOKEN, EOS_TOKEN = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1]
BOS_TOKEN_ID, EOS_TOKEN_ID = 0, 1
DEFAULT_MAX_MERGES = 256

# A GLM-flavoured chat template (Jinja, as transformers/SGLang expect it).
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Split used while learning merges. It approximates the GPT-2 pattern the ByteLevel pre-tokenizer
# applies at encode time (that one needs Unicode classes the stdlib `re` lacks); merges are valid
# whatever split learned them, this one just makes them useful.
_TRAIN_SPLIT = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A language model reads text as a sequence of tokens, and
each token is a small piece of a word, a whole word, a number or a mark of punctuation. When the model
is asked a question, it looks at the tokens it has seen so far and predicts the next one; then it adds
that token to the sequence and repeats the process until it writes an end of text token or reaches the
length limit that the server has set for the request.
Serving a large model on a graphics processor is mostly a question of moving memory. In the decode
phase every step reads the weights of each layer once, and the attention reads the cache of keys and
values that the previous steps have written. The faster the memory can be streamed through the
processor, the more tokens the server can produce in a second. Quantization to eight bit floating
point halves the bytes of every weight, and a block scale for each tile of one hundred and twenty
eight by one hundred and twenty eight values keeps the error small.
A mixture of experts layer sends each token to a few of its many expert networks. The router scores
the experts with a sigmoid, adds a correction bias, and keeps the top eight; the shared expert sees
every token. Because only the selected experts are read, the cost of a step depends on how the tokens
of the batch spread over the experts, and that is why the routing of real prompts matters for speed.
The sparse attention of this model first runs a small indexer that scores all the earlier positions,
then keeps the two thousand and forty eight best ones, and only those take part in the attention.
Tests should be quick, deterministic and clear: when one of them fails, the message ought to say what
was expected, what was found, and where. Good tools are simple to run, and they explain themselves.
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet of `tokenizers`)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@dataclass(frozen=True)
class TokenizerSpec:
    vocab: dict[str, int]  # token (byte-level string) -> id, specials included
    merges: tuple[tuple[str, str], ...]  # in priority order

    @property
    def size(self) -> int:
        return len(self.vocab)

    @property
    def bos_token_id(self) -> int:
        return self.vocab[BOS_TOKEN]

    @property
    def eos_token_id(self) -> int:
        return self.vocab[EOS_TOKEN]


def _learn_merges(text: str, max_merges: int, b2u: dict[int, str]) -> list[tuple[str, str]]:
    words = collections.Counter(
        tuple(b2u[b] for b in piece.encode("utf-8")) for piece in _TRAIN_SPLIT.findall(text))
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        new_words: collections.Counter[tuple[str, ...]] = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return merges


@functools.lru_cache(maxsize=4)
def build_tokenizer(max_merges: int = DEFAULT_MAX_MERGES) -> TokenizerSpec:
    """The vocabulary and merges (deterministic; cached)."""
    b2u = bytes_to_unicode()
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    merges = _learn_merges(_CORPUS, max_merges, b2u)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return TokenizerSpec(vocab=vocab, merges=tuple(merges))


def _added_token(i: int, content: str) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_json(tok: TokenizerSpec) -> dict:
    """The `tokenizer.json` document (tokenizers' serialization format, version 1.0)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(tok.vocab[t], t) for t in SPECIAL_TOKENS],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,  # encode() adds no BOS/EOS; the chat template adds the GLM prefix
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": tok.vocab,
            # "a b" strings: readable by every tokenizers release (byte-level tokens never contain a space)
            "merges": [f"{a} {b}" for a, b in tok.merges],
        },
    }


def write_tokenizer(out_dir: str | os.PathLike, *, vocab_size: int, model_max_length: int,
                    max_merges: int = DEFAULT_MAX_MERGES) -> TokenizerSpec:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`.

    `vocab_size` is the model's (embedding rows): every token id must be below it.
    """
    tok = build_tokenizer(max_merges)
    if tok.size > vocab_size:
        raise ValueError(f"the synthetic tokenizer has {tok.size} tokens but the model's vocab_size is "
                         f"{vocab_size}; lower max_merges (now {max_merges}) to at most {vocab_size - 256 - len(SPECIAL_TOKENS)}")
    out = Path(out_dir)
    _dump(out / "tokenizer.json", tokenizer_json(tok))
    _dump(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "added_tokens_decoder": {str(tok.vocab[t]): {k: v for k, v in _added_token(tok.vocab[t], t).items() if k != "id"}
                                 for t in SPECIAL_TOKENS},
        "chat_template": CHAT_TEMPLATE,
    })
    _dump(out / "special_tokens_map.json", {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN})
    return tok


def _dump(path: Path, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")
