"""asv benchmarks for the projection kernel (``pagedcy._libs._gemm``) against NumPy.

Shapes are the engine benchmark model's gate|up projection (2816 x 512) and its LM head
(32000 x 512), at decode and prefill row counts; ``track_speedup_vs_numpy`` is
``np.matmul(x, w.T)`` time over ours, measured back to back (absolute times drift on a
shared machine), at the CPU's instruction set; ``track_speedup_vs_numpy_avx2`` caps ours at
AVX2 (run asv with ``OPENBLAS_CORETYPE=Haswell`` to hold OpenBLAS to AVX2 too, as on an
AVX2-only CPU such as Zen 3). The issue-21 targets: >= 0.95 at 512 rows, > 1 at 1 and 16.
``track_bf16_speedup`` is the f32 weight's time over the bf16 weight's (``linear_rows``).
The full-step table is ``asv_benches/gemm_step.py``.
"""
import numpy as np

from pagedcy._libs._gemm import _linear_kernel_tuned, _linear_rows_tuned, linear_kernel
from pagedcy.tools.bench import best_time


class LinearKernel:
    params = ([1, 16, 64, 512, 1024], [(2816, 512), (32000, 512)])
    param_names = ["rows", "weight"]

    def setup(self, rows, weight):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((rows, weight[1]), dtype=np.float32)
        self.w = rng.standard_normal(weight, dtype=np.float32)
        self.bf16 = (self.w.view(np.uint32) >> 16).astype(np.uint16)
        self.out = np.empty((rows, weight[0]), np.float32)

    def time_linear_kernel(self, rows, weight):
        linear_kernel(self.x, self.w, self.out)

    def time_numpy_matmul(self, rows, weight):
        np.matmul(self.x, self.w.T, out=self.out)

    def _ratio(self, max_simd):
        ours = best_time(lambda: _linear_kernel_tuned(self.x, self.w, self.out, None, max_simd), 5)
        theirs = best_time(lambda: np.matmul(self.x, self.w.T, out=self.out), 5)
        return theirs / ours

    def track_speedup_vs_numpy(self, rows, weight):
        return self._ratio(2)

    def track_speedup_vs_numpy_avx2(self, rows, weight):
        return self._ratio(1)

    def track_bf16_speedup(self, rows, weight):
        f32 = best_time(lambda: linear_kernel(self.x, self.w, self.out), 5)
        bf16 = best_time(lambda: _linear_rows_tuned(self.x, self.bf16, "bf16", self.out), 5)
        return f32 / bf16

    def track_gflops(self, rows, weight):
        return 2.0 * rows * self.w.size / best_time(lambda: linear_kernel(self.x, self.w, self.out), 5) / 1e9
