# Integer arguments of the compiled modules. An exact int in range is accepted here without
# a Python call (page ids and layers are passed on every step); anything else, and every
# error, goes through pagedcy._validate, the one place that decides what is accepted and
# which exception a mistake raises.

cdef inline Py_ssize_t index_arg(object value, Py_ssize_t upper, str name) except -1:
    """``value`` as an index in ``[0, upper)``: TypeError / IndexError as ``_validate.check_index``."""
    cdef Py_ssize_t v = -1
    if type(value) is int:
        try:
            v = value
        except OverflowError:
            v = -1
        if 0 <= v < upper:
            return v
    from pagedcy import _validate
    return _validate.check_index(value, upper, name)


cdef inline object int_arg(object value, str name):
    """``value`` as an exact Python int of any size: TypeError as ``_validate.as_int``."""
    if type(value) is int:
        return value
    from pagedcy import _validate
    return _validate.as_int(value, name)
