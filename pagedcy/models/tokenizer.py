"""A small byte-level BPE tokenizer trained locally (no network) for random checkpoints."""
from __future__ import annotations

import json
import os

__all__ = ["CORPUS", "SPECIAL_TOKENS", "CHAT_TEMPLATE", "write_tokenizer"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>")

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A paged key-value cache keeps the keys and values
of every token in fixed-size pages, so a sequence can grow without copying and many sequences
can share the pages of a common prompt. The model reads its context through a block table that
maps each logical block of tokens onto a physical page of the pool.
Once upon a time there was a little town by the sea. Every morning the fishermen went out in
their boats, and every evening they came back with the day's catch. The children ran along the
harbour wall, counting the boats: one, two, three, four, five, six, seven, eight, nine, ten.
Hello! How are you today? I am fine, thank you. What is the weather like? It is sunny and warm,
with a light wind from the west. Shall we go for a walk in the park, or would you rather read?
def main():
    for i in range(10):
        print(f"step {i}: loss = {1.0 / (i + 1):.3f}")
    return 0
Numbers and symbols: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 + - * / = < > ( ) [ ] { }
The user asked a question and the assistant answered it politely, clearly and briefly.
Continuous batching lets a server add new requests to a running batch at every step, so the
processor stays busy while short and long answers finish at different times.
"""


def _train(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = CORPUS.splitlines(keepends=True)
    tok.train_from_iterator(lines * 4, trainer)
    return tok


def min_vocab_size() -> int:
    """Smallest model vocab a trained tokenizer fits in (the 256 bytes plus the specials)."""
    return 256 + len(SPECIAL_TOKENS)


def write_tokenizer(path: str | os.PathLike, vocab_size: int, max_length: int) -> int:
    """Train a byte-level BPE on :data:`CORPUS` with at most ``vocab_size`` tokens and write
    ``tokenizer.json`` + ``tokenizer_config.json`` (with a chat template) into ``path``.

    When the corpus yields fewer tokens than ``vocab_size``, the vocabulary is filled with
    unreachable ``<extra_i>`` tokens so every model id decodes. Returns the vocab size
    (== ``vocab_size``). ValueError if ``vocab_size`` < :func:`min_vocab_size`.
    """
    if vocab_size < min_vocab_size():
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= {min_vocab_size()}, "
                         f"got {vocab_size}")
    tok = _train(vocab_size)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for i in range(next_id, vocab_size):
        vocab[f"<extra_{i}>"] = i
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_length, "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return vocab_size


def special_token_ids() -> dict[str, int]:
    """Ids of the special tokens (trained first, so ids 0..len-1 in order)."""
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}
