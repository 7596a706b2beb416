"""The multi-sequence KV cache layer, pure Python over the compiled core: the multi-sequence cache manager
(block allocator, prefix cache, swap space), the weightless test executor and the scheduler."""
