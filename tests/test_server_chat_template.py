"""Chat templates: pagedcy's renderer against transformers' ``apply_chat_template`` on the
same tokenizer files, and where the template comes from."""
import json

import pytest

pytest.importorskip("jinja2")

from pagedcy.server.chat_template import ChatTemplate, TemplateError  # noqa: E402

# a Llama-3/Qwen-like template: loop controls, tojson, raise_exception, a system default,
# namespace() state, whitespace control and `tools is none`
RICH = """{%- set ns = namespace(system=false) -%}
{{- bos_token }}
{%- for message in messages %}
  {%- if message['role'] not in ['system', 'user', 'assistant'] %}
    {{- raise_exception('unsupported role: ' + message['role']) }}
  {%- endif %}
  {%- if loop.first and message['role'] != 'system' %}
    {{- '<|system|>\\nYou are helpful.' + eos_token }}
  {%- endif %}
  {%- if message['role'] == 'system' %}{% set ns.system = true %}{% endif %}
  {%- if message['content'] == 'SKIP' %}{% continue %}{% endif %}
  {{- '<|' + message['role'] + '|>\\n' + message['content'] | trim + eos_token }}
  {%- if message.meta is defined %}{{ message.meta | tojson }}{% endif %}
{%- endfor %}
{%- if tools is none %}{{ '' }}{% else %}{{ tools | tojson }}{% endif %}
{%- if add_generation_prompt %}
  {{- '<|assistant|>\\n' }}
{%- endif %}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "  be brief  "}, {"role": "user", "content": "ünïcödé?"},
     {"role": "assistant", "content": "SKIP"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "x", "meta": {"k": [1, "é"]}}],
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    from pagedcy.models import write_random_checkpoint
    return write_random_checkpoint(tmp_path_factory.mktemp("tpl") / "m", tokenizer=True,
                                   max_position_embeddings=256)


@pytest.mark.parametrize("template", ["checkpoint", "rich"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_as_transformers(ckpt, template, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(ckpt)
    ours = ChatTemplate.from_model_dir(ckpt)
    if template == "rich":
        ours = ChatTemplate(RICH, ours.special_tokens)
    for messages in CONVERSATIONS:
        want = hf.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=add_generation_prompt,
                                      chat_template=ours.source)
        assert ours.render(messages, add_generation_prompt=add_generation_prompt) == want


def test_raise_exception_and_sandbox():
    tpl = ChatTemplate(RICH, {"bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(TemplateError, match="unsupported role: tool"):
        tpl.render([{"role": "tool", "content": "x"}])
    # the sandbox refuses attribute access to Python internals
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateError):
        evil.render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_where_the_template_comes_from(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    assert ChatTemplate.from_model_dir(d) is None                     # no files at all
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert ChatTemplate.from_model_dir(d) is None                     # no template
    (d / "chat_template.jinja").write_text("{{ eos_token }}J")
    assert ChatTemplate.from_model_dir(d).render([]) == "</s>J"
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<B>", "lstrip": False}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "T"},
                          {"name": "default", "template": "{{ bos_token }}D"}]}))
    tpl = ChatTemplate.from_model_dir(d)
    assert tpl.render([]) == "<B>D"
