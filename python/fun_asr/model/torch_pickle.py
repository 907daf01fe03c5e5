"""Reads PyTorch ``torch.save`` checkpoints (``model.pt``) without torch and without running pickle code.

A zip-format checkpoint (torch >= 1.6) holds ``<top>/data.pkl`` (the pickled object tree),
``<top>/data/<key>`` (one raw little-endian buffer per storage), ``<top>/byteorder`` and
``<top>/version``; ``<top>`` is any folder name (``archive``, ``model``, the file's stem...).

``data.pkl`` is read by a :class:`pickle.Unpickler` whose ``find_class`` resolves only the handful of
globals that a state_dict needs, each to a function of this module (never to torch's or to anything
importable): ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2`` / ``_v3``,
``torch._utils._rebuild_parameter`` and the ``torch.<Type>Storage`` / ``torch.<dtype>`` tags. Every
other global -- ``os.system``, ``builtins.eval``, ``posix.system``, a model class -- raises
:class:`ModelFileError` naming it, before anything is called. Storages are mapped lazily (memory map
when stored uncompressed); a tensor is materialized by honouring its storage offset *and* strides,
after checking that every element it addresses lies inside its storage.

    load_state_dict(path)       -> {name: np.ndarray}      (BF16 -> float32; unwraps "state_dict"/"model")
    read_pickle(path)           -> object tree with TorchTensor leaves (lazy; .numpy() materializes)
    iter_tensors(tree)          -> (dotted name, TorchTensor) pairs
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import math
import pickle
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ModelFileError", "TorchTensor", "load_state_dict", "read_pickle", "iter_tensors"]


class ModelFileError(ValueError):
    """The file is not a checkpoint this reader accepts (not a zip checkpoint, forbidden global, bad tensor)."""


# what zipfile raises on a damaged archive or member (bad CRC or header, unsupported compression or
# encryption, a truncated deflate stream)
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, ValueError,
               zlib.error, OSError)  # OSError: a seek to a negative offset that a corrupt header gives


# torch dtype name (also the torch.<dtype> attribute _rebuild_tensor_v3 pickles) -> numpy dtype of one stored
# element, little-endian (bfloat16: its bits as uint16)
_NP_DTYPES: dict[str, str] = {
    "float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2", "int64": "<i8", "int32": "<i4",
    "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
}
# torch storage class name -> the dtype name of its elements
_STORAGE_TYPES: dict[str, str] = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
    "UntypedStorage": "uint8",  # element = byte; _rebuild_tensor_v3 gives the dtype
}


class _Sealed:
    """Base of every object data.pkl can reach through find_class/persistent_load: pickle's BUILD opcode
    cannot set state or attributes on it (so a file cannot tamper with the reader's own objects)."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise ModelFileError(f"data.pkl tries to set state on {type(self).__name__.lstrip('_')}; refused")

    def __setattr__(self, name: str, value: Any) -> None:
        raise ModelFileError(f"data.pkl tries to set {name!r} on {type(self).__name__.lstrip('_')}; refused")

    def __init__(self, *values: Any) -> None:
        """Sets the fields, given in ``__slots__`` order (the only way they are ever set)."""
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def __reduce__(self):  # pragma: no cover - not meant to be pickled again
        raise TypeError(f"{type(self).__name__} cannot be pickled")


class _StorageTag(_Sealed):
    """What ``torch.FloatStorage`` (and friends) unpickle to: a dtype, nothing callable."""

    __slots__ = ("torch_name", "dtype", "np_dtype")  # str each

    def __repr__(self) -> str:
        return f"torch.{self.torch_name}"


class _DtypeTag(_Sealed):
    """What ``torch.uint16`` (and friends) unpickle to, for _rebuild_tensor_v3."""

    __slots__ = ("dtype", "np_dtype")  # str each

    def __repr__(self) -> str:
        return f"torch.{self.dtype}"


class _Func(_Sealed):
    """An allowed global's stand-in: calls one function of this module."""

    __slots__ = ("name", "fn")  # the global's name, the function it calls

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return self.name


class _Archive:
    """The zip file: locates ``<top>/data.pkl`` and maps ``<top>/data/<key>`` lazily."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except _ZIP_ERRORS:
            raise _not_zip_error(path) from None
        pkls = [n for n in self._zip.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise ModelFileError(
                f"{path}: zip file is not a PyTorch checkpoint: expected exactly one '<folder>/data.pkl', "
                f"found {len(pkls)}")
        self.prefix = pkls[0][: -len("data.pkl")]
        bo = self.prefix + "byteorder"
        self.big_endian = False
        if bo in self._zip.namelist():
            order = self._read(bo).decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise ModelFileError(f"{path}: unknown byteorder record {order!r}; accepted: 'little', 'big'")
            self.big_endian = order == "big"
        self._arrays: dict[str, np.ndarray] = {}

    def _read(self, name: str, nbytes: int = -1) -> bytes:
        """A member's bytes (the first ``nbytes``); a damaged member is a ModelFileError, not a zip error."""
        try:
            with self._zip.open(name) as f:
                return f.read(nbytes)
        except _ZIP_ERRORS as exc:
            raise ModelFileError(f"{self.path}: {name} cannot be read from the zip archive ({type(exc).__name__}: "
                                 f"{exc})") from None

    def read_pickle_bytes(self) -> bytes:
        return self._read(self.prefix + "data.pkl")

    def storage_array(self, key: str, np_dtype: str, numel: int) -> np.ndarray:
        """1-D read-only array of ``numel`` elements of storage ``key`` (memory-mapped when possible)."""
        cache_key = f"{key}\0{np_dtype}"
        if cache_key in self._arrays:
            return self._arrays[cache_key]
        name = f"{self.prefix}data/{key}"
        try:
            info = self._zip.getinfo(name)
        except KeyError:
            raise ModelFileError(f"{self.path}: storage {key!r} referenced by data.pkl is missing ({name})") from None
        dt = np.dtype(np_dtype)
        nbytes = numel * dt.itemsize
        if info.file_size < nbytes:
            raise ModelFileError(
                f"{self.path}: storage {key!r} holds {info.file_size} bytes, data.pkl declares {numel} elements "
                f"of {dt.itemsize} bytes ({nbytes})")
        if numel == 0:
            arr = np.zeros(0, dt)
        elif info.compress_type == zipfile.ZIP_STORED:
            offset = self._data_offset(info)
            try:
                arr = np.memmap(self.path, dtype=dt, mode="r", offset=offset, shape=(numel,))
            except (ValueError, OSError) as exc:  # the member's data lies (partly) outside the file
                raise ModelFileError(f"{self.path}: storage {key!r} cannot be mapped ({exc})") from None
        else:
            arr = np.frombuffer(self._read(info.filename, nbytes), dtype=dt)
        if self.big_endian and dt.itemsize > 1:
            arr = arr.byteswap()
        arr.flags.writeable = False
        self._arrays[cache_key] = arr
        return arr

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        with open(self.path, "rb") as f:
            if info.header_offset < 0:
                raise ModelFileError(f"{self.path}: corrupt zip directory entry for {info.filename}")
            f.seek(info.header_offset)
            header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise ModelFileError(f"{self.path}: corrupt zip local header for {info.filename}")
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        return info.header_offset + 30 + name_len + extra_len

    def close(self) -> None:
        self._arrays.clear()
        self._zip.close()


class _Storage(_Sealed):
    """A storage of the checkpoint: its archive, its key under data/, its _StorageTag and its element count."""

    __slots__ = ("archive", "key", "tag", "numel")

    def array(self, np_dtype: str | None = None) -> np.ndarray:
        if np_dtype is None or np.dtype(np_dtype) == np.dtype(self.tag.np_dtype):
            return self.archive.storage_array(self.key, self.tag.np_dtype, self.numel)
        # untyped (byte) storage viewed as another dtype (_rebuild_tensor_v3)
        size = np.dtype(np_dtype).itemsize
        return self.archive.storage_array(self.key, np_dtype, (self.numel * np.dtype(self.tag.np_dtype).itemsize)
                                          // size)


class TorchTensor(_Sealed):
    """A tensor of the checkpoint, not read yet. ``dtype`` is torch's name ("float32", "bfloat16", ...);
    ``offset`` and ``stride`` count elements of the storage, as in torch."""

    __slots__ = ("_storage", "_np_dtype", "dtype", "offset", "shape", "stride", "requires_grad")

    def __init__(self, storage: _Storage, np_dtype: str, dtype: str, offset: int, shape: tuple[int, ...],
                 stride: tuple[int, ...], requires_grad: bool = False) -> None:
        super().__init__(storage, np_dtype, dtype, offset, shape, stride, requires_grad)

    def __repr__(self) -> str:
        return f"TorchTensor(dtype={self.dtype}, shape={self.shape}, stride={self.stride}, offset={self.offset})"

    @property
    def is_contiguous(self) -> bool:
        expected, acc = [], 1
        for n in reversed(self.shape):
            expected.append(acc)
            acc *= n
        return all(n <= 1 or s == e for n, s, e in zip(self.shape, self.stride, reversed(expected), strict=True))

    def raw(self) -> np.ndarray:
        """The elements as stored (BF16 as uint16), C-contiguous, owning its memory."""
        storage = self._storage.array(self._np_dtype)
        shape, stride, offset = self.shape, self.stride, self.offset
        numel = math.prod(shape)
        if numel == 0:
            return np.zeros(shape, storage.dtype)
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if last >= storage.shape[0]:
            raise ModelFileError(
                f"tensor (offset {offset}, shape {shape}, stride {stride}) reads element {last} of a storage "
                f"of {storage.shape[0]} elements")
        if numel > storage.shape[0]:
            raise ModelFileError(
                f"tensor of shape {shape} (stride {stride}) has more elements than its storage "
                f"({storage.shape[0]}): expanded/overlapping layouts are not accepted")
        item = storage.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage[offset:], shape=shape, strides=tuple(s * item for s in stride), writeable=False)
        return np.array(view, order="C", copy=True)

    def numpy(self) -> np.ndarray:
        """The tensor as a C-contiguous, writeable numpy array of its own (a copy, never the file's memory
        map); BF16 widened to float32 (exact)."""
        arr = self.raw()
        if self.dtype == "bfloat16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


def _not_zip_error(path: Path) -> ModelFileError:
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:1] == b"\x80":  # a pickle protocol marker: the legacy stream of pickles
        kind = "the legacy (pre-1.6, non-zip) torch.save format"
    elif tarfile.is_tarfile(path):
        kind = "the legacy tar torch.save format"
    else:
        kind = "not a zip archive"
    return ModelFileError(
        f"{path}: {kind}; only zip-format PyTorch checkpoints are read (re-save it with torch>=1.6: "
        "torch.save(torch.load(p, weights_only=True), p))")


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    if args:
        if len(args) != 1 or not isinstance(args[0], (list, tuple)):
            raise ModelFileError("data.pkl builds an OrderedDict from unexpected arguments; refused")
        return collections.OrderedDict(args[0])
    return collections.OrderedDict()


def _int_tuple(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ModelFileError(f"tensor {what} must be a tuple of ints, got {v!r}")
    return tuple(int(x) for x in v)


def _make_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                 np_dtype: str | None, dtype: str | None) -> TorchTensor:
    if not isinstance(storage, _Storage):
        raise ModelFileError(f"tensor storage must come from the archive, got {type(storage).__name__}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ModelFileError(f"tensor storage offset must be an int >= 0, got {offset!r}")
    shape = _int_tuple(size, "size")
    strides = _int_tuple(stride, "stride")
    if len(shape) != len(strides):
        raise ModelFileError(f"tensor size {shape} and stride {strides} differ in length")
    if any(n < 0 for n in shape) or any(s < 0 for s in strides):
        raise ModelFileError(f"tensor size {shape} / stride {strides} has a negative entry")
    return TorchTensor(storage, np_dtype or storage.tag.np_dtype, dtype or storage.tag.dtype, offset, shape,
                       strides, bool(requires_grad))


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None, *rest):  # noqa: ANN001, ANN202
    if isinstance(storage, _Storage) and storage.tag.torch_name == "UntypedStorage":
        raise ModelFileError("_rebuild_tensor_v2 on an untyped storage: dtype unknown")
    return _make_tensor(storage, storage_offset, size, stride, requires_grad, None, None)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
                       metadata=None, *rest):  # noqa: ANN001, ANN202
    if not isinstance(dtype, _DtypeTag):
        raise ModelFileError(f"_rebuild_tensor_v3 dtype must be a torch dtype, got {dtype!r}")
    if isinstance(storage, _Storage) and storage.tag.torch_name != "UntypedStorage":
        if np.dtype(storage.tag.np_dtype) != np.dtype(dtype.np_dtype):
            raise ModelFileError(f"_rebuild_tensor_v3: {dtype.dtype} tensor on a {storage.tag.torch_name}")
    return _make_tensor(storage, storage_offset, size, stride, requires_grad, dtype.np_dtype, dtype.dtype)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *rest):  # noqa: ANN001, ANN202
    if not isinstance(data, TorchTensor):
        raise ModelFileError(f"_rebuild_parameter expects a tensor, got {type(data).__name__}")
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _Func("collections.OrderedDict", _ordered_dict),
    ("torch._utils", "_rebuild_tensor_v2"): _Func("torch._utils._rebuild_tensor_v2", _rebuild_tensor_v2),
    ("torch._utils", "_rebuild_tensor_v3"): _Func("torch._utils._rebuild_tensor_v3", _rebuild_tensor_v3),
    ("torch._utils", "_rebuild_parameter"): _Func("torch._utils._rebuild_parameter", _rebuild_parameter),
    **{("torch", name): _StorageTag(name, dt, _NP_DTYPES[dt]) for name, dt in _STORAGE_TYPES.items()},
    ("torch.storage", "UntypedStorage"): _StorageTag("UntypedStorage", "uint8", _NP_DTYPES["uint8"]),
    **{("torch", dt): _DtypeTag(dt, npdt) for dt, npdt in _NP_DTYPES.items()},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: _Archive) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        # protocol < 3 pickles name Python 2 modules (__builtin__.eval); report and match Python 3 names
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        obj = _ALLOWED.get((module, name))
        if obj is None:
            raise ModelFileError(
                f"{self._archive.path}: data.pkl references the global '{module}.{name}', which is not allowed "
                "(a state_dict needs only OrderedDict, torch._utils._rebuild_tensor_v2/_v3, "
                "_rebuild_parameter and torch storage/dtype tags); refusing to load it")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ModelFileError(f"{self._archive.path}: unsupported persistent id {pid!r:.200}")
        _, tag, key, _location, numel = pid
        if not isinstance(tag, _StorageTag):
            raise ModelFileError(f"{self._archive.path}: storage type must be a torch storage class, got {tag!r}")
        if not isinstance(key, str) or not key or "/" in key or "\\" in key or ".." in key:
            raise ModelFileError(f"{self._archive.path}: bad storage key {key!r}")
        if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
            raise ModelFileError(f"{self._archive.path}: bad storage size {numel!r}")
        st = self._storages.get(key)
        if st is None:
            st = self._storages[key] = _Storage(self._archive, key, tag, numel)
        elif st.tag is not tag or st.numel != numel:
            raise ModelFileError(f"{self._archive.path}: storage {key!r} declared twice with different types/sizes")
        return st


_PUT_OPS = ("PUT", "BINPUT", "LONG_BINPUT")


def _check_memo(data: bytes, path: Path) -> None:
    """Refuses memo indices a pickle of this size cannot need. CPython's unpickler sizes its memo table by the
    largest index it is asked to store, so one LONG_BINPUT 2**31 in a 400-byte file asks for 16 GB; pickle.dump
    numbers the memo 0, 1, 2 ... so every honest index is below the number of opcodes."""
    import pickletools

    limit = len(data)
    for op, arg, pos in pickletools.genops(data):
        if op.name in _PUT_OPS and not (isinstance(arg, int) and 0 <= arg <= limit):
            raise ModelFileError(f"{path}: data.pkl stores memo entry {arg} at byte {pos}, beyond anything a "
                                 f"{limit}-byte pickle needs; refused")


def read_pickle(path: str | Path) -> Any:
    """The unpickled object tree of a zip-format checkpoint; tensors are lazy :class:`TorchTensor` objects."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    archive = _Archive(path)
    try:
        data = archive.read_pickle_bytes()
        _check_memo(data, path)
        return _RestrictedUnpickler(data, archive).load()
    except ModelFileError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError) as e:  # OverflowError: a FRAME or LONG length beyond what the platform can hold
        raise ModelFileError(f"{path}: data.pkl could not be read: {type(e).__name__}: {e}") from None


MAX_DEPTH = 256  # nesting of dicts/lists in a checkpoint (a state_dict needs 1-3; a reference cycle never ends)


def iter_tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, TorchTensor]]:
    """(dotted name, tensor) for every tensor in nested dicts/lists of ``tree``, depth first. ModelFileError when
    the containers nest deeper than MAX_DEPTH (a pickle can build a list that contains itself)."""
    stack: list[tuple[str, Any, int]] = [(prefix, tree, 0)]
    while stack:
        name, node, depth = stack.pop()
        if isinstance(node, TorchTensor):
            yield name, node
            continue
        if isinstance(node, dict):
            items = [(str(k), v) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(node)]
        else:
            continue
        if depth >= MAX_DEPTH:
            raise ModelFileError(f"checkpoint nests containers deeper than {MAX_DEPTH} levels at {name!r:.200} "
                                 "(or holds a reference cycle); refused")
        stack.extend((f"{name}.{k}" if name else k, v, depth + 1) for k, v in reversed(items))


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """``{name: array}`` of a checkpoint holding a state_dict, or a dict with a ``state_dict`` / ``model``
    entry that is one. BF16 tensors come back as float32 (exact), others in their own dtype; every array
    is a C-contiguous, writeable copy."""
    tree = read_pickle(path)
    if isinstance(tree, dict) and not any(isinstance(v, TorchTensor) for v in tree.values()):
        for key in ("state_dict", "model"):
            if isinstance(tree.get(key), dict):
                tree = tree[key]
                break
    if not isinstance(tree, dict):
        raise ModelFileError(f"{path}: the checkpoint is a {type(tree).__name__}, not a state_dict")
    out: dict[str, np.ndarray] = {}
    for name, t in iter_tensors(tree):
        out[name] = t.numpy()
    if not out:
        raise ModelFileError(f"{path}: no tensors found in the checkpoint")
    return out
