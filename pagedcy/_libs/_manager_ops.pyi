import numpy as np
import numpy.typing as npt
from pagedcy._libs._store import KVPageStore

def write_token_rows(store: KVPageStore, pages: npt.ArrayLike, offsets: npt.ArrayLike, layer: int,
                     keys: npt.ArrayLike, values: npt.ArrayLike) -> None: ...
def build_block_table(tables: list[npt.NDArray[np.int32]], width: int) -> npt.NDArray[np.int32]: ...
