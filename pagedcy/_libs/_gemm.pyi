import numpy as np
import numpy.typing as npt

SKINNY_MAX_ROWS: int
PARALLEL_MACS: int
PARALLEL_WEIGHT_BYTES: int

def skinny_linear(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32],
                  out: npt.NDArray[np.float32], num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
def _skinny_linear_tuned(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32],
                         out: npt.NDArray[np.float32], num_threads: int | None = ...,
                         max_simd: int = ...) -> npt.NDArray[np.float32]: ...
def linear(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], out: npt.NDArray[np.float32],
           num_threads: int | None = ...) -> npt.NDArray[np.float32]: ...
