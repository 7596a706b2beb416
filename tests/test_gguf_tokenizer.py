"""The tokenizer built from GGUF metadata equals transformers' GGUF tokenizer
(``AutoTokenizer.from_pretrained(dir, gguf_file=...)``) on a varied corpus: ids, and text
decoded with and without special tokens; the chat template renders the same."""
import os

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from pagedcy.models import write_random_checkpoint                     # noqa: E402
from pagedcy.models.gguf_file import GGUFFile                           # noqa: E402
from pagedcy.models.gguf_tokenizer import SUPPORTED_PRE_TOKENIZERS, gguf_tokenizer  # noqa: E402
from pagedcy.server.chat_template import ChatTemplate                   # noqa: E402
from pagedcy.tools.gguf_fixture import (SPM_CORPUS, train_sentencepiece,  # noqa: E402
                                        write_vocab_gguf)

TEXTS = SPM_CORPUS + [
    "", " ", "  two leading", "trailing  ", "\n", "\n\n\t x", "a  b   c    d", "x\r\ny",
    "😀😀 🇫🇷 👩‍👩‍👧", "ℌ𝔢𝔩𝔩𝔬 ﬁ ① Ⅻ", "日本語と English の mix", "1234567 12.5e-10 0x1F",
    "<s> hi </s>", "<s><s>", "</s>tail", "<tool> x<|ctrl|>y", "<unk>", "<|user|>hi<|assistant|>",
    "<|system|>\nBe brief.</s>\n", "<bos><start_of_turn>user\nhi<end_of_turn>\n<eos>", "'s 're 've 'll 'd I'M DON'T", "   \t\t   ", "é" * 40,
    "if (a && b) { return c ? d : e; } // comment\n\tprint(\"x\")",
]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] | trim }}"
            "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief. 日本"}, {"role": "user", "content": " Hi 😀 "},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_tok")
    spm = train_sentencepiece(d / "sp")
    bpe_dir = write_random_checkpoint(d / "bpe", "LlamaForCausalLM")
    out = {
        "spm": write_vocab_gguf(d / "spm.gguf", "llama", spm_model=spm, chat_template=TEMPLATE),
        "spm_gemma3": write_vocab_gguf(d / "spm_gemma3.gguf", "gemma3",
                                       spm_model=train_sentencepiece(d / "gemma", gemma=True)),
        "bpe": write_vocab_gguf(d / "bpe.gguf", "llama", hf_dir=bpe_dir),
    }
    for pre in ("llama-bpe", "qwen2", "tekken"):
        out["bpe_" + pre] = write_vocab_gguf(d / f"bpe_{pre}.gguf", "qwen2" if pre == "qwen2" else "llama",
                                             hf_dir=bpe_dir, pre_tokenizer=pre)
    return out


def _ours(path):
    with GGUFFile(path) as f:
        return gguf_tokenizer(f.metadata)


def _theirs(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.mark.parametrize("kind", ["spm", "spm_gemma3", "bpe", "bpe_llama-bpe", "bpe_qwen2",
                                  "bpe_tekken"])
def test_encode_decode_match_transformers(files, kind):
    ours, theirs = _ours(files[kind]), _theirs(files[kind])
    with GGUFFile(files[kind]) as f:
        n_tokens = len(f.metadata["tokenizer.ggml.tokens"])
    # transformers' GPT2Tokenizer also appends its default "<|endoftext|>" when a byte-level
    # vocabulary lacks it (an id past the model's vocab); ours keeps the file's tokens only
    assert ours.vocab_size == n_tokens <= len(theirs)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_special_tokens_and_bos(files):
    tok = _ours(files["spm"])
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    ids = tok.encode("hi")
    assert ids[0] == tok.token_to_id("<s>")                 # add_bos_token (SPM default)
    ctrl = tok.token_to_id("<|ctrl|>")
    with_ctrl = tok.encode("a<|ctrl|>b")
    assert ctrl in with_ctrl                                # a control token stays whole ...
    assert "<|ctrl|>" not in tok.decode(with_ctrl)          # ... and is special
    assert "<|ctrl|>" in tok.decode(with_ctrl, skip_special_tokens=False)
    tool = tok.token_to_id("<tool>")                        # user-defined: whole, not special
    assert tool in tok.encode("x <tool> y") and "<tool>" in tok.decode(tok.encode("<tool>"))
    bpe = _ours(files["bpe"])
    assert bpe.encode("hi")[0] != bpe.token_to_id("<s>")    # the file says add_bos_token false


def test_chat_template_matches_transformers(files):
    ours, theirs = _ours(files["spm"]), _theirs(files["spm"])
    assert ours.chat_template == TEMPLATE
    tpl = ChatTemplate(ours.chat_template, {"bos_token": ours.bos_token, "eos_token": ours.eos_token})
    for gen in (True, False):
        want = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert tpl.render(MESSAGES, add_generation_prompt=gen) == want


def test_bpe_template_from_tokenizer_config(files):
    from pagedcy.models.tokenizer import CHAT_TEMPLATE

    assert _ours(files["bpe"]).chat_template == CHAT_TEMPLATE


def test_unknown_pre_tokenizer_and_model_refused(tmp_path, files):
    with GGUFFile(files["bpe"]) as f:
        md = dict(f.metadata)
    with pytest.raises(ValueError, match="pre-tokenizer.*'nonesuch'.*llama-bpe"):
        gguf_tokenizer(dict(md, **{"tokenizer.ggml.pre": "nonesuch"}))
    with pytest.raises(ValueError, match="tokenizer model.*'rwkv'"):
        gguf_tokenizer(dict(md, **{"tokenizer.ggml.model": "rwkv"}))
    assert {"default", "gpt2", "llama-bpe", "qwen2"} <= set(SUPPORTED_PRE_TOKENIZERS)


@pytest.mark.parametrize("key,value,match", [
    ("tokenizer.ggml.tokens", "abc", "tokens"),
    ("tokenizer.ggml.tokens", [], "tokens"),
    ("tokenizer.ggml.merges", [1, 2], "merges"),
    ("tokenizer.ggml.merges", ["a b c"], "merges"),
    ("tokenizer.ggml.bos_token_id", 10**9, "bos_token_id"),
    ("tokenizer.ggml.bos_token_id", "1", "bos_token_id"),
    ("tokenizer.ggml.add_bos_token", 1, "add_bos_token"),
    ("tokenizer.chat_template", 5, "chat_template"),
])
def test_bad_tokenizer_metadata(files, key, value, match):
    with GGUFFile(files["bpe"]) as f:
        md = dict(f.metadata)
    with pytest.raises(ValueError, match=match):
        gguf_tokenizer(dict(md, **{key: value}))


def test_bad_spm_metadata(files):
    import numpy as np

    with GGUFFile(files["spm"]) as f:
        md = dict(f.metadata)
    with pytest.raises(ValueError, match="scores"):
        gguf_tokenizer({k: v for k, v in md.items() if k != "tokenizer.ggml.scores"})
    with pytest.raises(ValueError, match="scores"):
        gguf_tokenizer(dict(md, **{"tokenizer.ggml.scores": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match="token_type"):
        gguf_tokenizer(dict(md, **{"tokenizer.ggml.token_type": np.zeros(2, np.int32)}))


def test_add_space_prefix_false_is_honoured(files):
    with GGUFFile(files["spm"]) as f:
        md = dict(f.metadata)
    with_prefix = gguf_tokenizer(md)
    without = gguf_tokenizer(dict(md, **{"tokenizer.ggml.add_space_prefix": False}))
    first = lambda tok: tok.backend.id_to_token(tok.encode("hello", add_special_tokens=False)[0])  # noqa: E731
    assert first(with_prefix).startswith("\u2581") and not first(without).startswith("\u2581")
    for tok in (with_prefix, without):
        assert tok.decode(tok.encode("hello world")) == "hello world"


def test_byte_alphabet_is_tokenizers():
    from tokenizers import pre_tokenizers

    from pagedcy.models.gguf_tokenizer import _bytes_to_unicode

    table = _bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("key,value", [("tokenizer.ggml.pre", ["qwen2"]), ("tokenizer.ggml.model", 3)])
def test_mistyped_tokenizer_names(files, key, value):
    with GGUFFile(files["bpe"]) as f:
        md = dict(f.metadata)
    with pytest.raises(ValueError, match=key.split(".")[-1]):
        gguf_tokenizer(dict(md, **{key: value}))


@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_incremental_detokenizer_concatenates_to_decode(files, kind):
    """The engine's streaming detokenizer works on a GGUF-built tokenizer: its pieces join to
    the decode of the completion's tokens (byte-fallback tokens of a multi-byte character
    held until complete)."""
    tok = _ours(files[kind])
    for text in ("日本語のテキスト 😀 ok", "def f(x):\n    return x", "Ünïcödé  spaces"):
        ids = tok.encode(text, add_special_tokens=False)
        det = tok.detokenizer()
        pieces = [det.step(i) for i in ids]
        assert not any(p.endswith("\ufffd") for p in pieces)
        assert "".join(pieces) + det.flush() == tok.decode(ids)


def test_add_bos_and_add_eos_flags(files):
    with GGUFFile(files["spm"]) as f:
        md = dict(f.metadata)
    bos, eos = md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]
    both = gguf_tokenizer(dict(md, **{"tokenizer.ggml.add_eos_token": True}))
    ids = both.encode("hi")
    assert ids[0] == bos and ids[-1] == eos
    assert both.encode("hi", add_special_tokens=False)[-1] != eos
    neither = gguf_tokenizer(dict(md, **{"tokenizer.ggml.add_bos_token": False}))
    assert bos not in neither.encode("hi") and eos not in neither.encode("hi")


def test_llama3_pieces_skip_merges(files):
    """A pre-token that is itself a vocabulary token is taken whole under the Llama 3 split
    (ignore_merges), and merged from bytes under GPT-2's; the flag default follows llama.cpp."""
    with GGUFFile(files["bpe_llama-bpe"]) as f:
        md = dict(f.metadata)
    import numpy as np

    tokens = list(md["tokenizer.ggml.tokens"]) + ["zqxj"]       # reachable by no merge
    types = np.append(md["tokenizer.ggml.token_type"], 1)
    md.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    llama3 = gguf_tokenizer(md)
    gpt2 = gguf_tokenizer(dict(md, **{"tokenizer.ggml.pre": "gpt2"}))
    whole = len(tokens) - 1
    assert llama3.encode("zqxj", add_special_tokens=False) == [whole]
    assert whole not in gpt2.encode("zqxj", add_special_tokens=False)
    assert types[whole] == 1
    no_flag = {k: v for k, v in md.items() if k != "tokenizer.ggml.add_bos_token"}
    assert gguf_tokenizer(no_flag).encode("hi")[0] == md["tokenizer.ggml.bos_token_id"]
    no_flag["tokenizer.ggml.pre"] = "qwen2"
    assert gguf_tokenizer(no_flag).encode("hi")[0] != md["tokenizer.ggml.bos_token_id"]
