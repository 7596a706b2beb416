"""The README's Python examples run as written (the model example on a random checkpoint)."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")
pytestmark = pytest.mark.skipif(not os.path.exists(README), reason="README.md not beside the tests")


def _block(needle):
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if needle in b]
    assert blocks, f"no python block with {needle!r} in README.md"
    return blocks[0]


def test_model_example_runs(tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from pagedcy.models import write_random_checkpoint
    pytest.importorskip("gguf")
    from pagedcy.tools.gguf_fixture import write_gguf
    path = write_random_checkpoint(tmp_path / "ckpt", seed=3)
    gguf = write_gguf(path, str(tmp_path / "model-q8_0.gguf"), tensor_type="Q8_0")
    code = _block("LLM(")
    name = re.search(r'LLM\("([^"]+\.gguf)"\)', code).group(1)   # the example's GGUF file
    assert '"path/to/checkpoint"' in code
    namespace = {}
    exec(compile(code.replace(f'"{name}"', repr(gguf)), "README.md", "exec"), namespace)
    outputs = namespace["outputs"]
    assert [o.prompt for o in outputs] == ["Hello, my name is", "The capital of France is"]
    for o in outputs:
        done = o.outputs[0]
        assert o.finished and done.finish_reason in ("stop", "length")
        assert 1 <= len(done.token_ids) <= 64
        assert done.text == namespace["llm"].get_tokenizer().decode(done.token_ids) or \
            done.finish_reason == "stop"


def test_cache_example_runs():
    namespace = {}
    exec(compile(_block("PagedKVCacheConfig("), "README.md", "exec"), namespace)
    assert namespace["out"].shape == (3, 32, 128)
    assert namespace["b"].num_cached_tokens() == 32
