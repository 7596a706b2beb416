"""The README's quick start runs as written."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


@pytest.mark.skipif(not os.path.exists(README), reason="README.md not beside the tests")
def test_quick_start_runs():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "no python block in README.md"
    namespace = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.shape == (3, 32, 128)
    assert namespace["b"].num_cached_tokens() == 32
