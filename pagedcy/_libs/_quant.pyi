from typing import Sequence

import numpy as np
import numpy.typing as npt

SUPPORTED_TYPES: tuple[int, ...]

def block_info(ggml_type: int) -> tuple[int, int]: ...
def dequantize(raw: npt.NDArray[np.uint8], ggml_type: int, shape: int | Sequence[int],
               num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
def _dequantize_tuned(raw: npt.NDArray[np.uint8], ggml_type: int, shape: int | Sequence[int],
                      num_threads: int | None = ..., max_simd: int = ...) -> npt.NDArray[np.float32]: ...
def quantize(x: npt.NDArray[np.float32], ggml_type: int,
             num_threads: int | None = ...) -> npt.NDArray[np.uint8]: ...
