"""The element types: one table that every list of types in the suite is made from.

Each row is a NumPy dtype with the name nccl-tests prints for it (``-d`` takes it too), the
other names ``-d`` takes, and what runs it beside our algorithms: the GPU path (CuPy's ufuncs
reduce CuPy's own types; bfloat16, which CuPy holds from version 14, our own kernel; fp8 nothing,
CuPy having no such arrays: :func:`.device.lacks`) and gloo's CPU all-reduce; ``train`` is the name ``bench train
--dtype`` gives the types DDP trains in here. The row order is the order of :data:`DTYPES`,
whose index every rank exchanges: append, never reorder.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class ElementType:
    dtype: np.dtype
    nccl: str  # the name nccl-tests prints in its type column
    aliases: tuple = ()  # other names -d takes
    gpu: str = "cupy"  # how the GPU path reduces it: "cupy" (CuPy's ufuncs), "kernel" (ours), "" (it cannot)
    gloo: bool = False  # gloo's all-reduce takes it
    train: str = ""  # bench train's --dtype name, where DDP trains in it here

    @property
    def name(self):
        """NumPy's name (``float32``, ``bfloat16``, ``float8_e4m3fn``)."""
        return self.dtype.name


TYPES = (
    ElementType(np.dtype("int8"), "int8", ("char",), gloo=True),
    ElementType(np.dtype("int16"), "int16"),
    ElementType(np.dtype("int32"), "int32", ("int",), gloo=True),
    ElementType(np.dtype("int64"), "int64", gloo=True),
    ElementType(np.dtype("uint8"), "uint8", gloo=True),
    ElementType(np.dtype("uint16"), "uint16"),
    ElementType(np.dtype("uint32"), "uint32", ("uint",)),
    ElementType(np.dtype("uint64"), "uint64"),
    ElementType(np.dtype("float16"), "half", gloo=True),
    ElementType(np.dtype("float32"), "float", gloo=True, train="fp32"),
    ElementType(np.dtype("float64"), "double", gloo=True),
    ElementType(np.dtype(ml_dtypes.bfloat16), "bfloat16", ("bf16",), gpu="kernel", gloo=True, train="bf16"),
    ElementType(np.dtype(ml_dtypes.float8_e4m3fn), "f8e4m3", gpu=""),
    ElementType(np.dtype(ml_dtypes.float8_e5m2), "f8e5m2", gpu=""),
)

#: every element type our collectives reduce, in the table's order
DTYPES = tuple(t.dtype for t in TYPES)
#: the floating types NumPy does not count as floating (their ``kind`` is not always ``"f"``)
LOW_PRECISION = frozenset(t.dtype for t in TYPES if t.dtype.type.__module__.startswith("ml_dtypes"))
#: dtype -> its row
BY_DTYPE = {t.dtype: t for t in TYPES}


def other_names(t):
    """The names of row ``t`` besides NumPy's and nccl-tests': its aliases and ``bench train``'s."""
    return [n for n in dict.fromkeys((*t.aliases, t.train)) if n and n not in (t.nccl, t.name)]


#: every name a type flag takes (NumPy's, nccl-tests', the others) -> its row, in every tool
BY_NAME = {name: t for t in TYPES for name in (t.name, t.nccl, *other_names(t))}


def nccl_name(dtype):
    """The name nccl-tests prints for ``dtype`` (a dtype or NumPy's name of one)."""
    row = BY_NAME.get(dtype) if isinstance(dtype, str) else BY_DTYPE.get(np.dtype(dtype))
    return row.nccl if row else str(dtype)


def names_text(rows=TYPES):
    """The names of ``rows`` that a type flag takes, for its help and its error: nccl-tests' name
    of each with its other names in brackets, then NumPy's names where they differ."""
    shown = [t.nccl + (f" ({', '.join(other_names(t))})" if other_names(t) else "") for t in rows]
    return ", ".join(shown + [t.name for t in rows if t.name != t.nccl])
