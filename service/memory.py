"""glibc allocator settings for a server that makes many large, short-lived arrays.

Every thread of the pool gets its own glibc arena by default, and freed memory stays in them:
after a burst of large requests the server would keep its peak size (measured: 1.1 GB after a
load run that started at 0.2 GB). Two arenas, and a trim after large responses (once no request
holds memory: service.http.budget.Budget.trim_when_idle), give the
memory back. (A fixed mmap threshold would too, but made large requests ~30 % slower.)
"""

import ctypes
import ctypes.util

M_ARENA_MAX = -8


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return (
        libc
        if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")
        else None
    )


_LIBC = _glibc()


def tune_allocator() -> bool:
    """Cap glibc's arenas at two; False where the C library is not glibc (nothing changes)."""
    if _LIBC is None:
        return False
    _LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(_LIBC.mallopt(M_ARENA_MAX, 2) == 1)


def release_memory() -> None:
    """Give free heap pages back to the system (run after a large response)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
