import numpy as np
import numpy.typing as npt

def step_slot_arrays(block_tables: npt.NDArray[np.int32], kv_lens: npt.NDArray[np.int64],
                     q_lens: npt.NDArray[np.int64], page_size: int
                     ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32],
                                npt.NDArray[np.int32]]: ...
def check_step_layout(ids: npt.NDArray[np.int32], positions: npt.NDArray[np.int32],
                      qo_indptr: npt.NDArray[np.int32], kv_lens: npt.NDArray[np.int32],
                      vocab_size: int, max_position: int) -> None: ...
def check_step_pages(slot_pages: npt.NDArray[np.int32], slot_offsets: npt.NDArray[np.int32],
                     kv_lens: npt.NDArray[np.int32], block_tables: npt.NDArray[np.int32],
                     positions: npt.NDArray[np.int32], qo_indptr: npt.NDArray[np.int32],
                     max_pages: int, page_size: int) -> None: ...
def touched_blocks(block_tables: npt.NDArray[np.int32], kv_lens: npt.NDArray[np.int64],
                   q_lens: npt.NDArray[np.int64], page_size: int
                   ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.int32]]: ...
def first_bad_q_len(q_lens: object, kv_lens: npt.NDArray[np.int64]) -> int: ...
