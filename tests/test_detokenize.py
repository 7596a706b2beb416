"""Completion text is the tokenizer's decode of the completion's own tokens (issue 23).

For every completion: the streamed pieces concatenate to the final ``text``; the final text
equals ``tokenizer.decode(token_ids, skip_special_tokens=True)`` (less a stop token, and cut
where a matched stop string starts); no prompt text leaks in; a character cut short by the end
of the completion is emitted (as U+FFFD) instead of dropped. Checked on three tokenizers: the
byte-level BPE ``write_random_checkpoint`` trains, a byte-level BPE trained on multilingual
text, and a SentencePiece model with byte fallback (Llama's decoder chain), with prompts whose
tails end inside a multi-byte character, ``n > 1`` forks, preemption, stop strings and the
server's streamed and non-streamed responses.
"""
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")

from engine_helpers import ToyConfig  # noqa: E402

from pagedcy import PagedKVCacheConfig  # noqa: E402
from pagedcy.engine import LLM, LLMEngine, SamplingParams  # noqa: E402
from pagedcy.engine.tokenizer import Tokenizer, load_tokenizer  # noqa: E402
from pagedcy.models import write_random_checkpoint  # noqa: E402

CORPUS = ["Hello world, héllo wörld! Ça va? naïve café crème brûlée",
          "日本語のテキストです。東京は大きい都市です。中文也可以。",
          "emoji 😀🎉👍🏽 mix ✓ ★ → ∑ ≠", "def f(x):\n    return x ** 2  # code",
          "12345 67890 3.14159", "   spaces   and\ttabs\n\n", "Привет мир, как дела?",
          "한국어 텍스트 입니다", "Ελληνικά κείμενα", "naïve façade São Paulo Zürich"]


def _bpe(path):
    """A byte-level BPE trained here on CORPUS (CJK, emoji, accents)."""
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers
    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(path)
    return path


def _spm(directory):
    """A SentencePiece unigram model with byte fallback, trained here, in a ``tokenizers``
    pipeline as transformers converts SentencePiece models (Metaspace pre-tokenizer; Llama's
    Replace/ByteFallback/Fuse/Strip decoders)."""
    spm = pytest.importorskip("sentencepiece")
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, pre_tokenizers
    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(CORPUS * 30))
    prefix = os.path.join(directory, "m")
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=400,
                                   byte_fallback=True, character_coverage=0.98,
                                   model_type="unigram", hard_vocab_limit=False,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tok = HF(models.Unigram(vocab, unk_id=sp.unk_id(), byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True)
                            for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())])
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    assert tok.token_to_id("<0xE4>") is not None
    return path


@pytest.fixture(scope="module", params=["random-checkpoint", "multilingual-bpe", "spm-bytes"])
def tok(request, tmp_path_factory):
    d = str(tmp_path_factory.mktemp(request.param))
    if request.param == "random-checkpoint":
        return load_tokenizer(write_random_checkpoint(d, seed=0))
    path = _bpe(os.path.join(d, "tokenizer.json")) if request.param == "multilingual-bpe" \
        else _spm(d)
    return Tokenizer(path, {"eos_token": "</s>", "bos_token": "<s>"})


def partial_ids(tok):
    """Ids of tokens whose bytes are not whole UTF-8 characters (parts of one)."""
    out = []
    for i, (raw, _) in sorted(tok.token_bytes_table().items()):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    assert out, "the tokenizer has no token holding part of a character"
    return out


class ScriptedModel:
    """Logits that depend only on a row's last token and position (a seeded draw), so a
    completion is the same whatever shares the batch, biased toward tokens that hold parts
    of multi-byte characters so that sampled completions split characters everywhere."""

    def __init__(self, vocab_size, favoured, eos=()):
        self.config = ToyConfig(vocab_size=vocab_size, num_layers=1, num_heads=1,
                                num_kv_heads=1, head_dim=4, eos_token_ids=tuple(eos))
        self.bias = np.zeros(vocab_size, np.float32)
        self.bias[favoured] = 1.5

    def kv_cache_config(self, max_pages, page_size=16, dtype="float32"):
        return PagedKVCacheConfig(page_size, max_pages, 1, 1, 4, dtype=dtype)

    def forward(self, kv_pages, token_ids, slots):
        rows = slots.qo_indptr[1:] - 1
        out = np.empty((rows.shape[0], self.bias.shape[0]), np.float32)
        for b, r in enumerate(rows.tolist()):
            rng = np.random.default_rng([int(token_ids[r]), int(slots.positions[r])])
            out[b] = rng.standard_normal(self.bias.shape[0]).astype(np.float32) + self.bias
        return out


def expected(tok, comp, stops):
    """What ``comp.text`` must be: the decode of its token ids (less a final stop token),
    cut where the first matched stop string starts."""
    ids = comp.token_ids
    if comp.finish_reason == "stop" and not isinstance(comp.stop_reason, str):
        ids = ids[:-1]                              # EOS or a stop token id: no text
    full = tok.decode(ids, skip_special_tokens=True)
    if isinstance(comp.stop_reason, str):
        cut = min(full.find(s) for s in stops if s in full)
        assert full[cut:].startswith(comp.stop_reason)
        return full[:cut]
    return full


def run(engine, requests):
    """All cumulative outputs per request id, in order."""
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    seen = {rid: [] for rid, _, _ in requests}
    while engine.has_unfinished_requests():
        for o in engine.step():
            seen[o.request_id].append(o)
    return seen


def check(tok, seen, stops=()):
    """The equalities of the module docstring, for every completion of every request."""
    for outs in seen.values():
        final = outs[-1]
        assert final.finished
        for comp in final.outputs:
            streamed = ""
            for o in outs:                         # deltas as the server takes them
                text = o.outputs[comp.index].text
                assert text.startswith(streamed)
                streamed = text
            assert streamed == comp.text
            assert comp.text == expected(tok, comp, stops)


def test_detokenizer_pieces_concatenate_to_decode(tok):
    rng = np.random.default_rng(1)
    part = partial_ids(tok)
    for _ in range(40):
        ids = rng.integers(0, tok.vocab_size, int(rng.integers(1, 40))).tolist()
        ids += rng.choice(part, int(rng.integers(0, 4))).tolist()   # ends inside a character
        rng.shuffle(ids) if rng.random() < 0.5 else None
        det = tok.detokenizer()
        pieces = [det.step(i) for i in ids]
        assert all(not p.endswith("\ufffd") for p in pieces)
        assert "".join(pieces) + det.flush() == tok.decode(ids)
        assert det.flush() == ""
    text = "naïve 日本語 😀 ok"
    det = tok.detokenizer()
    assert "".join(det.step(i) for i in tok.encode(text, add_special_tokens=False)) + \
        det.flush() == tok.decode(tok.encode(text, add_special_tokens=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_engine_text_is_the_decode_of_the_tokens(tok, data):
    part = partial_ids(tok)
    eos = tok.token_to_id("</s>")
    model = ScriptedModel(tok.vocab_size, part, eos=[eos] if eos is not None else [])
    ids = st.integers(0, tok.vocab_size - 1)
    reqs = []
    for r in range(data.draw(st.integers(1, 4), label="requests")):
        prompt = data.draw(st.lists(ids, min_size=1, max_size=40), label="prompt")
        prompt += data.draw(st.lists(st.sampled_from(part), min_size=0, max_size=3), label="tail")
        params = SamplingParams(n=data.draw(st.integers(1, 3), label="n"), temperature=1.0,
                                seed=data.draw(st.integers(0, 2**31), label="seed"),
                                max_tokens=data.draw(st.integers(1, 30), label="max_tokens"),
                                ignore_eos=data.draw(st.booleans(), label="ignore_eos"))
        reqs.append((f"r{r}", {"prompt_token_ids": prompt}, params))
    pages = data.draw(st.sampled_from([None, 20]), label="kv_cache_pages")   # 20: preemption
    engine = LLMEngine.from_model(model, tokenizer=tok, page_size=4,
                                  kv_cache_pages=pages or 256, max_num_batched_tokens=64)
    seen = run(engine, reqs)
    check(tok, seen)
    # the same requests with stop strings taken from those texts: cut at the first match,
    # the text before it unchanged, whether the match spans tokens or held bytes
    texts = [c.text for outs in seen.values() for c in outs[-1].outputs if len(c.text) >= 2]
    if texts:
        text = data.draw(st.sampled_from(texts), label="stop source")
        a = data.draw(st.integers(0, len(text) - 1), label="stop start")
        stop = text[a:a + data.draw(st.integers(1, 3), label="stop length")]
        stops = [stop, "\x07never\x07"]
        reqs = [(rid + "s", p, SamplingParams(n=q.n, temperature=1.0, seed=q.seed,
                                              max_tokens=q.max_tokens, ignore_eos=q.ignore_eos,
                                              stop=stops)) for rid, p, q in reqs]
        check(tok, run(engine, reqs), stops)
    assert engine.stats().kv_pages_free == engine.stats().kv_pages_total


def test_preempted_and_forked_completions_keep_their_text(tok):
    part = partial_ids(tok)
    model = ScriptedModel(tok.vocab_size, part)
    rng = np.random.default_rng(3)
    reqs = [(f"p{i}", {"prompt_token_ids": rng.integers(0, tok.vocab_size, 20).tolist()
                       + [part[i % len(part)]]},
             SamplingParams(n=2, temperature=1.0, seed=i, max_tokens=24, ignore_eos=True))
            for i in range(4)]
    small = LLMEngine.from_model(model, tokenizer=tok, page_size=4, kv_cache_pages=16)
    seen = run(small, reqs)
    assert small.stats().num_preemptions > 0
    check(tok, seen)
    roomy = run(LLMEngine.from_model(model, tokenizer=tok, page_size=4, kv_cache_pages=256), reqs)
    for rid in seen:
        assert [c.text for c in seen[rid][-1].outputs] == [c.text for c in roomy[rid][-1].outputs]


def test_issue_repro_prompt_tail_does_not_leak_and_the_end_is_flushed(tmp_path):
    """The issue's repro: the prompt's last tokens decode to an incomplete character."""
    m = write_random_checkpoint(str(tmp_path), seed=0, max_position_embeddings=4096)
    llm = LLM(m, num_threads=1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 500, int(n)).tolist() for n in rng.integers(20, 300, 8)]
    tok = llm.get_tokenizer()
    for n in (1, 4, 12):
        o = llm.generate([{"prompt_token_ids": prompts[1]}],
                         SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
        assert o.text == tok.decode(o.token_ids)


def test_logprob_tokens_carry_their_bytes(tok):
    from pagedcy.server.serving import RequestRunner
    runner = RequestRunner.__new__(RequestRunner)
    runner.tokenizer = tok
    part = partial_ids(tok)
    text = "日本 😀 café"
    ids = tok.encode(text, add_special_tokens=False) + part[:2]
    raw = b"".join(runner.token_bytes(i) for i in ids)
    ref = tok.encode("x", add_special_tokens=False)   # bytes are what a token adds mid-text
    assert raw.decode("utf-8", "replace") == tok.decode(ref + ids)[len(tok.decode(ref)):]
    for i in part[:5]:
        s = runner.decode_token(i)
        assert s.startswith("bytes:") and bytes.fromhex(s[6:].replace("\\x", "")) == \
            runner.token_bytes(i)
    offsets = runner.text_offsets(ids, 0)
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(tok.decode(ids))


def test_server_streamed_and_whole_text_equal_decode(tok):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from server_fake import InProcessServer
    part = partial_ids(tok)
    engine = LLMEngine.from_model(ScriptedModel(tok.vocab_size, part), tokenizer=tok,
                                  page_size=4, kv_cache_pages=128)
    prompt = np.random.default_rng(5).integers(0, tok.vocab_size, 12).tolist() + part[:2]
    with InProcessServer(engine) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        kw = dict(model="fake-model", prompt=prompt, max_tokens=20, n=2, seed=7,
                  temperature=1.0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**kw)
        texts = ["", ""]
        for ch in client.completions.create(stream=True, **kw):
            for c in ch.choices:
                texts[c.index] += c.text
        for c in whole.choices:
            assert texts[c.index] == c.text
        ref = run(LLMEngine.from_model(ScriptedModel(tok.vocab_size, part), tokenizer=tok,
                                       page_size=4, kv_cache_pages=128),
                  [("x", {"prompt_token_ids": prompt},
                    SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=20,
                                   ignore_eos=True))])["x"][-1]
        for c in ref.outputs:
            assert c.text == tok.decode(c.token_ids) == texts[c.index]
