import numpy as np
import numpy.typing as npt

PARALLEL_ELEMENTS: int

def rms_norm(x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], eps: float,
             out: npt.NDArray[np.float32], residual: npt.NDArray[np.float32] | None = ...,
             num_threads: int | None = ...) -> None: ...
def qkv_rope(qkv: npt.NDArray[np.float32], positions: npt.NDArray[np.int32],
             cos: npt.NDArray[np.float32], sin: npt.NDArray[np.float32],
             q_out: npt.NDArray[np.float32], k_out: npt.NDArray[np.float32],
             v_out: npt.NDArray[np.float32], num_heads: int, num_kv_heads: int,
             bias: npt.NDArray[np.float32] | None = ..., q_norm: npt.NDArray[np.float32] | None = ...,
             k_norm: npt.NDArray[np.float32] | None = ..., eps: float = ...,
             num_threads: int | None = ...) -> None: ...
def silu_mul(gate_up: npt.NDArray[np.float32], out: npt.NDArray[np.float32],
             num_threads: int | None = ...) -> None: ...
def gelu_tanh_mul(gate_up: npt.NDArray[np.float32], out: npt.NDArray[np.float32],
                  num_threads: int | None = ...) -> None: ...
def _rows_build() -> int: ...
