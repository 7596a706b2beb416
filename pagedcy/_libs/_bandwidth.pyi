import numpy as np

def read_bandwidth(
    nbytes: int = ..., num_threads: int | None = ..., repeats: int = ..., *, buffer: np.ndarray | None = ...
) -> float: ...
def page_read_bandwidth(
    page_bytes: int = ...,
    nbytes: int = ...,
    num_threads: int | None = ...,
    repeats: int = ...,
    *,
    streams: int = ...,
    row_bytes: int = ...,
    seed: int | None = ...,
    buffer: np.ndarray | None = ...,
) -> float: ...
def _page_walk_sum(
    buffer: np.ndarray, page_bytes: int, streams: int = ..., row_bytes: int = ..., seed: int | None = ...
) -> float: ...
def fma_rate(num_threads: int | None = ..., simd: int = ..., repeats: int = ..., *, rounds: int = ...) -> float: ...
