"""Run Hugging Face decoder-only checkpoints (Llama, Mistral, Qwen2, Qwen3, Gemma 3) on the
paged KV cache.

    from pagedcy.models import load_model
    model = load_model("path/to/checkpoint")          # config.json + *.safetensors
    logits = model.forward(store.pages(), token_ids, slots)

Weights are held as the file stores them by default (``dtype="auto"``: 16-bit stays 16-bit),
widened to float32 (``dtype="float32"``) or quantized at load (``quantization="q8_0"``);
compute is float32 (:mod:`pagedcy.models.storage`, :mod:`pagedcy.models.linear`).
safetensors / tokenizers are imported only when a checkpoint is loaded or written.
"""
from pagedcy.models.config import SUPPORTED_ARCHITECTURES, SUPPORTED_ROPE_TYPES, ModelConfig
from pagedcy.models.loader import load_model
from pagedcy.models.model import CausalLM
from pagedcy.models.checkpoint import write_random_checkpoint

__all__ = ["CausalLM", "ModelConfig", "SUPPORTED_ARCHITECTURES", "SUPPORTED_ROPE_TYPES",
           "load_model", "write_random_checkpoint"]
