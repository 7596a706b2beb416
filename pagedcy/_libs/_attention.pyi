from typing import Any, Literal, Sequence, overload

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

@overload
def batch_paged_attention(
    query: npt.ArrayLike,
    qo_indptr: npt.ArrayLike,
    kv_pages: np.ndarray,
    layer: int,
    block_tables: npt.ArrayLike,
    kv_lens: npt.ArrayLike,
    *,
    scale: float | None = ...,
    causal: bool = ...,
    window_left: int = ...,
    soft_cap: float = ...,
    alibi_slopes: npt.ArrayLike | None = ...,
    out: np.ndarray | None = ...,
    return_lse: Literal[False] = ...,
    num_threads: int | None = ...,
    quantize_query: bool = ...,
) -> np.ndarray: ...
@overload
def batch_paged_attention(
    query: npt.ArrayLike,
    qo_indptr: npt.ArrayLike,
    kv_pages: np.ndarray,
    layer: int,
    block_tables: npt.ArrayLike,
    kv_lens: npt.ArrayLike,
    *,
    scale: float | None = ...,
    causal: bool = ...,
    window_left: int = ...,
    soft_cap: float = ...,
    alibi_slopes: npt.ArrayLike | None = ...,
    out: np.ndarray | None = ...,
    return_lse: Literal[True],
    num_threads: int | None = ...,
    quantize_query: bool = ...,
) -> tuple[np.ndarray, np.ndarray]: ...
@disjoint_base
class AttentionBatch:
    qo_indptr: np.ndarray
    kv_lens: np.ndarray
    block_tables: np.ndarray
    total_q: int
    page_size: int
    max_pages: int
    def __init__(
        self,
        qo_indptr: npt.ArrayLike,
        block_tables: npt.ArrayLike,
        kv_lens: npt.ArrayLike,
        *,
        page_size: int,
        max_pages: int,
    ) -> None: ...
    def run(
        self,
        query: npt.ArrayLike,
        kv_pages: np.ndarray,
        layer: int,
        *,
        scale: float | None = ...,
        causal: bool = ...,
        window_left: int = ...,
        soft_cap: float = ...,
        alibi_slopes: npt.ArrayLike | None = ...,
        out: np.ndarray | None = ...,
        return_lse: bool = ...,
        num_threads: int | None = ...,
        quantize_query: bool = ...,
    ) -> Any: ...

@overload
def merge_states(
    v_a: npt.ArrayLike, s_a: npt.ArrayLike, v_b: npt.ArrayLike, s_b: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def merge_states(
    v_a: Sequence[npt.ArrayLike], s_a: Sequence[npt.ArrayLike], v_b: None = ..., s_b: None = ...
) -> tuple[np.ndarray, np.ndarray]: ...
def simd_enabled() -> bool: ...
def simd_level() -> int: ...

_TUNE_FLAGS: dict[str, int]

def _set_min_parallel_work(team: float, other: float) -> tuple[float, float]: ...
def _vnni_paths() -> set[str]: ...

def _batch_paged_attention_tuned(
    query: npt.ArrayLike,
    qo_indptr: npt.ArrayLike,
    kv_pages: np.ndarray,
    layer: int,
    block_tables: npt.ArrayLike,
    kv_lens: npt.ArrayLike,
    *,
    scale: float | None = ...,
    causal: bool = ...,
    window_left: int = ...,
    soft_cap: float = ...,
    alibi_slopes: npt.ArrayLike | None = ...,
    out: np.ndarray | None = ...,
    return_lse: bool = ...,
    num_threads: int | None = ...,
    kv_chunk: int = ...,
    max_simd: int = ...,
    flags: int | str | Sequence[str] = ...,
    repeat: int = ...,
    quantize_query: bool = ...,
) -> Any: ...
