import numpy as np
import numpy.typing as npt

PARALLEL_MACS: int
PARALLEL_WEIGHT_BYTES: int
FORMATS: dict[str, tuple[int, tuple[type, ...]]]
BLOCK_FORMATS: dict[str, int]
Q8A_FORMATS: tuple[str, ...]

def linear_kernel(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32],
                  out: npt.NDArray[np.float32], num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
def _linear_kernel_tuned(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32],
                         out: npt.NDArray[np.float32], num_threads: int | None = ...,
                         max_simd: int = ...) -> npt.NDArray[np.float32]: ...
def _linear_rows_tuned(x: npt.NDArray[np.float32], weight: npt.NDArray, fmt: str,
                       out: npt.NDArray[np.float32], num_threads: int | None = ...,
                       max_simd: int = ...) -> npt.NDArray[np.float32]: ...
def linear_rows(x: npt.NDArray[np.float32], weight: npt.NDArray, fmt: str, out: npt.NDArray[np.float32],
                num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
def linear(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], out: npt.NDArray[np.float32],
           num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
def _quantize_activations(x: npt.NDArray[np.float32], max_simd: int = ...) -> tuple[
    npt.NDArray[np.int8], npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...
def _linear_rows_q8_tuned(x: npt.NDArray[np.float32], weight: npt.NDArray[np.uint8], fmt: str,
                          out: npt.NDArray[np.float32], num_threads: int | None = ...,
                          max_simd: int = ...) -> npt.NDArray[np.float32]: ...
def linear_rows_q8(x: npt.NDArray[np.float32], weight: npt.NDArray[np.uint8], fmt: str,
                   out: npt.NDArray[np.float32], num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
