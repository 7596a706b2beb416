"""Where an engine step's time goes, the GEMM-only yardstick and peak memory.

:class:`StepProfile` swaps timing wrappers into ``pagedcy.models.model``'s module globals (its
``linear`` projections, ``run_attention`` and elementwise kernels) for the duration of a
``with`` block, so a step splits into GEMM / attention / elementwise / the rest (Python,
scheduling, sampling) without the model knowing. Each wrapper costs two ``perf_counter``
calls, well under 1% of a step.
"""
import time

import numpy as np

# module globals of pagedcy.models.model, by the part of a step they belong to
GEMM = ("linear",)
ELEMENTWISE = ("qkv_rope", "rms_norm", "silu_mul", "gelu_tanh_mul", "write_token_rows")
ATTENTION = ("run_attention",)


def _timed_linear(fn, acc):
    """``linear`` timed into ``acc["gemm"]``, its flops counted into ``acc["gemm_flops"]``."""
    def wrapper(x, w, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(x, w, *args, **kwargs)
        finally:
            acc["gemm"] += time.perf_counter() - t0
            acc["gemm_flops"] += 2.0 * x.shape[0] * x.shape[1] * w.shape[0]
    return wrapper


def _timed(fn, acc, key):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - t0
    return wrapper


class StepProfile:
    """``with StepProfile() as prof: ...`` accumulates seconds in ``prof.acc`` under "gemm",
    "attention" and "elementwise" (K/V writes included) for every model forward run inside
    the block, and the GEMMs' floating-point operations under "gemm_flops"."""

    def __init__(self):
        self.acc = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, "gemm_flops": 0.0}
        self._saved = {}
        self._mod = None    # pagedcy.models.model while the block runs

    def reset(self):
        """Zero every accumulator."""
        for k in self.acc:
            self.acc[k] = 0.0

    def __enter__(self):
        from pagedcy.models import model as m
        self._mod = m
        self._saved = {name: getattr(m, name) for name in GEMM + ATTENTION + ELEMENTWISE}
        for name in GEMM:
            setattr(m, name, _timed_linear(self._saved[name], self.acc))
        for name in ATTENTION:
            setattr(m, name, _timed(self._saved[name], self.acc, "attention"))
        for name in ELEMENTWISE:
            setattr(m, name, _timed(self._saved[name], self.acc, "elementwise"))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(self._mod, name, fn)
        return False


def gemm_only_seconds(cfg, n_tokens, n_seqs, repeats=3):
    """Best time NumPy's matmul alone takes for one forward's GEMMs: every layer's q|k|v,
    o, gate|up and down projections on ``n_tokens`` rows plus the LM head on ``n_seqs`` rows,
    float32, into preallocated outputs (the shapes ``CausalLM.forward`` multiplies; weights
    ``[out, in]`` passed as ``W.T``, as ``linear`` hands them to BLAS)."""
    rng = np.random.default_rng(0)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    shapes = [(n_tokens, h, qkv), (n_tokens, cfg.num_heads * d, h), (n_tokens, h, 2 * inter),
              (n_tokens, inter, h)]
    # activations shared, weights distinct per layer (as in the model: they stream from memory)
    acts = [(rng.standard_normal((m, k), dtype=np.float32), np.empty((m, n), np.float32))
            for m, k, n in shapes]
    ops = [(a, rng.standard_normal((n, k), dtype=np.float32).T, out)
           for _ in range(cfg.num_layers) for (a, out), (m, k, n) in zip(acts, shapes)]
    ops.append((rng.standard_normal((n_seqs, h), dtype=np.float32),
                rng.standard_normal((cfg.vocab_size, h), dtype=np.float32).T,
                np.empty((n_seqs, cfg.vocab_size), np.float32)))
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for a, b, out in ops:
            np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return best


def proc_status_bytes(field):
    """A kB field of /proc/self/status (``VmRSS``, ``VmHWM``, ...) in bytes; None where
    there is no such file or field."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes():
    """This process's peak resident set size in bytes: ``VmHWM`` from /proc/self/status
    (``ru_maxrss`` elsewhere; on Linux that one keeps the parent's peak across fork + exec)."""
    hwm = proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    import sys
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
