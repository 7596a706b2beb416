"""Text in and out on a real (random) checkpoint with its tokenizer: prompts as text,
incremental detokenization, stop strings, LLM.generate, the lazy ``pagedcy.LLM`` and
checkpoint errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

import pagedcy  # noqa: E402
from pagedcy.engine import LLM, LLMEngine, SamplingParams  # noqa: E402
from pagedcy.engine.tokenizer import load_tokenizer  # noqa: E402
from pagedcy.models import write_random_checkpoint  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(str(tmp_path_factory.mktemp("text")), seed=2,
                                   max_position_embeddings=512)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, kv_cache_pages=96, num_threads=1)


def stream(engine, rid, prompt, params):
    """All outputs of one request, checking texts only grow."""
    engine.add_request(rid, prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid:
                if outs:
                    for a, b in zip(outs[-1].outputs, o.outputs):
                        assert b.text.startswith(a.text)
                outs.append(o)
    return outs


def test_tokenizer_metadata_and_round_trip(ckpt):
    tok = load_tokenizer(ckpt)
    assert tok.eos_token == "</s>" and tok.bos_token == "<s>"
    assert tok.chat_template and "messages" in tok.chat_template
    text = "Hello, héllo wörld ✓ 日本!"
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(TypeError):
        tok.encode(b"bytes")


def test_detokenizer_pieces_hold_back_split_characters(ckpt):
    tok = load_tokenizer(ckpt)
    text = " wörld ✓ 日本 ok"
    ids = tok.encode(text)
    det = tok.detokenizer()
    pieces = [det.step(i) for i in ids]
    assert "".join(pieces) == text
    assert "" in pieces                      # a multi-byte character spans tokens
    assert all("\ufffd" not in p for p in pieces)
    rng = np.random.default_rng(0)
    for _ in range(5):                       # arbitrary ids, as a random model emits them
        r = rng.integers(0, tok.vocab_size, 30).tolist()
        det = tok.detokenizer()
        pieces = "".join(det.step(i) for i in r)
        assert tok.decode(r).startswith(pieces)
        assert pieces + det.flush() == tok.decode(r)
        assert det.flush() == ""


def test_text_prompt_output_text_is_the_decoded_tokens(llm):
    eng = llm.llm_engine
    outs = stream(eng, "t", "Once upon a time", GREEDY)
    final = outs[-1].outputs[0]
    assert outs[-1].prompt == "Once upon a time"
    assert outs[-1].prompt_token_ids == llm.get_tokenizer().encode("Once upon a time")
    assert final.text == llm.get_tokenizer().decode(final.token_ids)
    assert len(outs) == 24 and outs[-1].finished and not outs[-2].finished


def test_stop_strings_cut_the_text(llm):
    eng = llm.llm_engine
    prompt = "The children ran along the harbour"
    base = stream(eng, "base", prompt, GREEDY)[-1].outputs[0]
    text = base.text
    assert len(text) >= 12
    for start in (2, 5, 9):
        stop = text[start:start + 3]
        cut = text.index(stop)
        outs = stream(eng, f"s{start}", prompt, SamplingParams(
            temperature=0, max_tokens=24, stop=["never appears \x07", stop]))
        out = outs[-1].outputs[0]
        assert out.text == text[:cut]
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)
        assert base.token_ids[:len(out.token_ids)] == out.token_ids
        assert all(stop not in o.outputs[0].text for o in outs)
    out = stream(eng, "none", prompt, SamplingParams(temperature=0, max_tokens=24,
                                                     stop="\x07\x07"))[-1].outputs[0]
    assert out.text == text and out.finish_reason == "length"


def test_eos_token_stops_without_text(ckpt):
    eng = LLMEngine(ckpt, kv_cache_pages=64, num_threads=1)
    base = stream(eng, "b", "Hello! How are you", GREEDY)[-1].outputs[0]
    tok = eng.tokenizer
    # make the 5th generated token a stop token id: its text is left out
    t = base.token_ids[4]
    k = base.token_ids.index(t)
    out = stream(eng, "e", "Hello! How are you", SamplingParams(
        temperature=0, max_tokens=24, stop_token_ids=[t]))[-1].outputs[0]
    assert out.token_ids == base.token_ids[:k + 1] and out.stop_reason == t
    assert out.text == tok.decode(base.token_ids[:k])


def test_llm_generate_forms_and_order(llm):
    tok = llm.get_tokenizer()
    prompts = ["Hello there", tok.encode("The quick brown fox"),
               {"prompt_token_ids": tok.encode("What is the weather")}, {"prompt": "Count"}]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [
        tok.encode("Hello there"), tok.encode("The quick brown fox"),
        tok.encode("What is the weather"), tok.encode("Count")]
    assert [o.prompt for o in outs] == ["Hello there", None, None, "Count"]
    singles = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in singles]
    per = llm.generate(prompts[:2], [SamplingParams(temperature=0, max_tokens=3),
                                     SamplingParams(temperature=0, max_tokens=5)],
                       use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in per] == [3, 5]
    assert llm.generate([], GREEDY) == []


def test_llm_generate_bad_input_leaves_nothing_running(llm):
    eng = llm.llm_engine
    with pytest.raises(ValueError, match="2 sampling_params for 3 prompts"):
        llm.generate(["a", "b", "c"], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate(["fine", [1, 10 ** 6], "also fine"], GREEDY)
    with pytest.raises(TypeError):
        llm.generate(42)
    assert not eng.has_unfinished_requests()
    assert eng.manager.stats().used_blocks == 0
    assert llm.generate("still works", GREEDY, use_tqdm=False)[0].finished


def test_lazy_top_level_names_keep_import_numpy_only():
    code = ("import sys, pagedcy\n"
            "assert pagedcy.SamplingParams is pagedcy.engine.SamplingParams\n"
            "assert 'LLM' in dir(pagedcy) and pagedcy.LLM.__name__ == 'LLM'\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('tokenizers', 'safetensors', 'torch', 'transformers', 'tqdm')]\n"
            "assert not heavy, heavy\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    with pytest.raises(AttributeError):
        pagedcy.NoSuchThing


def test_checkpoint_errors(tmp_path, ckpt):
    with pytest.raises(FileNotFoundError):
        LLMEngine(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        LLMEngine(str(empty))
    bad = tmp_path / "bad-tokenizer"
    write_random_checkpoint(str(bad), seed=1)
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer"):
        LLMEngine(str(bad))
    (bad / "tokenizer.json").unlink()
    (bad / "tokenizer_config.json").unlink()
    eng = LLMEngine(str(bad), kv_cache_pages=16, num_threads=1)     # ids still work
    assert eng.tokenizer is None
    with pytest.raises(ValueError, match="tokenizer"):
        eng.add_request("x", "text", GREEDY)
    eng.add_request("y", [5, 6, 7], SamplingParams(max_tokens=2))
    while eng.has_unfinished_requests():
        outs = eng.step()
    assert outs[0].outputs[0].text == "" and len(outs[0].outputs[0].token_ids) == 2
    corrupt = tmp_path / "corrupt"
    write_random_checkpoint(str(corrupt), seed=1, tokenizer=False)
    with open(corrupt / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError):
        LLMEngine(str(corrupt))
    cfg = json.loads((corrupt / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (corrupt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2"):
        LLMEngine(str(corrupt))


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_half_precision_kv_cache(ckpt, kv_dtype):
    prompts = ["Once upon a time", "The quick brown fox", "Hello! How are you"]
    params = SamplingParams(temperature=0, max_tokens=8)
    ref = LLM(ckpt, kv_cache_pages=32, num_threads=1).generate(prompts, params, use_tqdm=False)
    llm = LLM(ckpt, kv_cache_pages=32, num_threads=1, kv_dtype=kv_dtype)
    assert llm.llm_engine.manager.config.dtype == kv_dtype
    outs = llm.generate(prompts, params, use_tqdm=False)
    # 16-bit K/V moves logits slightly; the first token comes from the prompt's own
    # float32 activations and K/V rounded once, so it agrees
    assert [o.outputs[0].token_ids[0] for o in outs] == [o.outputs[0].token_ids[0] for o in ref]
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)


def test_int8_kv_cache(ckpt):
    """kv_dtype="int8": the engine's pages are int8 rows of head_dim + 4 (values, then the
    row's scale), every step quantizes and reads them, and greedy tokens mostly agree with
    the float32 cache (an int8 cache that dropped its scales would agree by chance only)."""
    prompts = ["Once upon a time", "The quick brown fox", "Hello! How are you", "In 1999 we"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ref = LLM(ckpt, kv_cache_pages=32, num_threads=1).generate(prompts, params, use_tqdm=False)
    llm = LLM(ckpt, kv_cache_pages=32, num_threads=1, kv_dtype="int8")
    cfg = llm.llm_engine.manager.config
    pages = llm.llm_engine.manager.store.pages()
    assert cfg.dtype == "int8" and pages.dtype == np.int8 and pages.shape[-1] == cfg.head_dim + 4
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
    pairs = [(a, b) for o, r in zip(outs, ref) for a, b in zip(o.outputs[0].token_ids, r.outputs[0].token_ids)]
    assert sum(a == b for a, b in pairs) >= len(pairs) // 2, pairs
    assert np.any(pages != 0)                       # the pages hold the quantized K/V


def test_progress_bar_only_on_a_terminal(llm, monkeypatch):
    pytest.importorskip("tqdm")
    import io

    class Term(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    for tty, use, shown in ((True, True, True), (False, True, False), (True, False, False)):
        err = Term(tty)
        monkeypatch.setattr(sys, "stderr", err)
        llm.generate(["a", "b"], SamplingParams(max_tokens=2), use_tqdm=use)
        assert ("Processed prompts" in err.getvalue()) == shown
