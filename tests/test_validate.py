"""The shared boundary checks in ``pagedcy._validate`` that the models and the executor use."""
import numpy as np
import pytest

from pagedcy import _validate
from pagedcy.kvcache.executor import PagedExecutorConfig


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_int32_array_converts_integer_dtypes(dtype):
    x = np.arange(12, dtype=dtype).reshape(3, 4)[:, ::2]           # strided on purpose
    out = _validate.int32_array(x, "x", (3, -1))
    assert out.dtype == np.int32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, x.astype(np.int64))


@pytest.mark.parametrize("x, shape, exc, match", [
    (np.zeros(3, np.float32), (-1,), TypeError, "integer array"),
    ([True, False], (-1,), TypeError, "integer array"),
    (np.zeros((2, 3), np.int32), (-1,), ValueError, r"shape \[\?\]"),
    (np.zeros(4, np.int32), (3,), ValueError, r"shape \[3\]"),
    (np.zeros((2, 3), np.int32), (2, 4), ValueError, r"shape \[2, 4\]"),
    (np.array([0, 2**31], np.int64), (-1,), ValueError, "outside int32"),
    (np.array([-2**31 - 1], np.int64), (-1,), ValueError, "outside int32"),
])
def test_int32_array_rejects(x, shape, exc, match):
    with pytest.raises(exc, match=match):
        _validate.int32_array(x, "x", shape)


def test_int32_array_keeps_the_int32_extremes():
    x = np.array([-2**31, 2**31 - 1], np.int64)
    np.testing.assert_array_equal(_validate.int32_array(x, "x", (2,)), x)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (True, TypeError),
                                      (2.0, TypeError), ("4", TypeError), (None, TypeError)])
@pytest.mark.parametrize("field", ["vocab_size", "num_layers", "head_dim", "max_sequence_length"])
def test_executor_config_rejects_non_positive_or_non_int_sizes(field, bad, exc):
    with pytest.raises(exc, match=field):
        PagedExecutorConfig(**{field: bad})
    assert PagedExecutorConfig(**{field: np.int64(3)}).__getattribute__(field) == 3
