"""``import pagedcy`` (and the light entry points) stay NumPy-only: none of the optional
heavy dependencies is loaded until a feature that needs it is used. Each case runs in a
fresh interpreter, since this test process has long since imported them."""
import os
import subprocess
import sys

import pytest

import pagedcy

HEAVY = ("torch", "transformers", "safetensors", "tokenizers", "tqdm", "fastapi", "starlette",
         "pydantic", "uvicorn", "jinja2", "rich", "prometheus_client", "httpx", "openai", "gguf",
         "sentencepiece")

CASES = [
    "import pagedcy; pagedcy.show_config()",
    "from pagedcy import kvcache",
    "import pagedcy.models",
    "import pagedcy.engine",
    "import pagedcy; pagedcy.LLM, pagedcy.SamplingParams",
    "import pagedcy.tools.cli, pagedcy.tools.info, pagedcy.tools.demo, pagedcy.tools.bench",
    "import pagedcy.models.gguf_model, pagedcy.models.gguf_tokenizer, pagedcy.tools.gguf_fixture",
]


@pytest.mark.parametrize("statement", CASES)
def test_entry_point_imports_no_heavy_dependency(statement):
    code = (f"import sys\n{statement}\n"
            f"import pagedcy\nprint(pagedcy.__file__)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[-2] == pagedcy.__file__            # the tree under test, not another install
    assert out[-1] == "[]", f"{statement!r} loaded {out[-1]}"
