"""fun_asr.model.torch_pickle: torch.save checkpoints read without torch and without running pickle code."""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fun_asr.model.torch_pickle import ModelFileError, TorchTensor, iter_tensors, load_state_dict, read_pickle

torch = pytest.importorskip("torch")


def _to_numpy(t):  # noqa: ANN001, ANN202
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.contiguous().numpy()


def _assert_same(ours: dict, ref: dict) -> None:
    assert list(ours) == list(ref)
    for k, v in ref.items():
        want = _to_numpy(v)
        got = ours[k]
        assert got.shape == want.shape, k
        assert got.dtype == want.dtype, k
        assert got.flags.c_contiguous and got.flags.writeable, k  # a private copy, not the read-only map
        np.testing.assert_array_equal(got, want, err_msg=k)


def _save(obj, path: Path, **kw) -> Path:  # noqa: ANN001
    torch.save(obj, path, **kw)
    return path


def test_dtypes_match_torch_load(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    sd = collections.OrderedDict(
        f32=torch.randn(3, 5, generator=g),
        bf16=torch.randn(4, 6, generator=g).to(torch.bfloat16),
        f16=torch.randn(7, generator=g).to(torch.float16),
        f64=torch.randn(2, 2, generator=g).double(),
        i64=torch.arange(-5, 6, dtype=torch.int64).reshape(1, 11),
        i32=torch.arange(12, dtype=torch.int32) * -3,
        u8=torch.arange(250, 256, dtype=torch.uint8),
        b=torch.tensor([True, False, True]),
        scalar=torch.tensor(3.5),
        empty=torch.zeros(0, 4),
        u16=torch.tensor([1, 2, 65535], dtype=torch.int32).to(torch.uint16),  # _rebuild_tensor_v3
    )
    p = _save(sd, tmp_path / "dtypes.pt")
    ref = torch.load(p, weights_only=True)
    _assert_same(load_state_dict(p), ref)
    tree = read_pickle(p)
    assert isinstance(tree["bf16"], TorchTensor) and tree["bf16"].dtype == "bfloat16"
    raw = tree["bf16"].raw()
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, ref["bf16"].view(torch.int16).numpy().view(np.uint16))


def test_strided_offset_and_shared_storages(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 8, generator=g)
    flat = torch.randn(100, generator=g)
    conv = torch.randn(1, 20, 128, 1, generator=g).permute(2, 0, 1, 3)  # strides (1, 2560, 128, 1) like conv_left
    sd = {
        "t": base.t(),  # transposed view of base's storage
        "row": base[2],  # storage offset 16
        "col": base[:, 3],  # offset 3, stride 8
        "slice": flat[10:40:3],  # offset 10, stride 3
        "strided": torch.as_strided(flat, (4, 5), (7, 2), 9),
        "base": base,  # shares the storage of t/row/col
        "conv_left": conv,
        "bf16_t": base.to(torch.bfloat16).t()[1:, ::2],
    }
    assert not sd["t"].is_contiguous() and sd["row"].storage_offset() == 16
    p = _save(sd, tmp_path / "strided.pt")
    ref = torch.load(p, weights_only=True)
    assert ref["col"].stride() == (8,) and ref["col"].storage_offset() == 3
    ours = load_state_dict(p)
    _assert_same(ours, ref)
    tree = read_pickle(p)
    assert tree["t"].stride == (1, 8) and not tree["t"].is_contiguous
    assert tree["col"].offset == 3 and tree["col"].stride == (8,)
    assert tree["t"]._storage is tree["base"]._storage  # one storage, read once


@pytest.mark.parametrize("wrap", ["state_dict", "model", None])
def test_nested_checkpoint_and_parameters(tmp_path: Path, wrap: str | None) -> None:
    lin = torch.nn.Linear(4, 3)
    sd = lin.state_dict()
    obj = {wrap: sd, "epoch": 3, "note": "x", "lr": [0.1, 0.2]} if wrap else sd
    p = _save(obj, tmp_path / "nested.pt")
    ref = torch.load(p, weights_only=True)
    _assert_same(load_state_dict(p), ref[wrap] if wrap else ref)
    # nn.Parameter objects pickle through torch._utils._rebuild_parameter
    p2 = _save({"w": torch.nn.Parameter(torch.ones(2, 2)), "b": lin.bias}, tmp_path / "params.pt")
    got = load_state_dict(p2)
    np.testing.assert_array_equal(got["w"], np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(got["b"], lin.bias.detach().numpy())
    names = [n for n, _ in iter_tensors(read_pickle(p))]
    assert names == ([f"{wrap}.weight", f"{wrap}.bias"] if wrap else ["weight", "bias"])


def _rewrite_zip(src: Path, dst: Path, rename=None, replace=None) -> Path:  # noqa: ANN001
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            name = info.filename
            if replace and name.split("/", 1)[1] in replace:
                data = replace[name.split("/", 1)[1]](data)
            if rename:
                name = rename + "/" + name.split("/", 1)[1]
            zout.writestr(name, data)
    return dst


def test_any_top_folder_and_big_endian_and_compressed(tmp_path: Path) -> None:
    sd = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.arange(4, dtype=torch.int64)}
    p = _save(sd, tmp_path / "plain.pt")
    q = _rewrite_zip(p, tmp_path / "renamed.pt", rename="whatever_name")
    _assert_same(load_state_dict(q), sd)

    def swap(dtype):  # noqa: ANN001, ANN202
        return lambda data: np.frombuffer(data, dtype).byteswap().tobytes()

    big = _rewrite_zip(p, tmp_path / "big.pt", replace={"byteorder": lambda _: b"big", "data/0": swap("<f4"),
                                                        "data/1": swap("<i8")})
    _assert_same(load_state_dict(big), sd)

    comp = tmp_path / "deflated.pt"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(comp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    _assert_same(load_state_dict(comp), sd)


def test_real_vad_model_pt(fsmn_vad_model: Path) -> None:
    p = fsmn_vad_model / "model.pt"
    ref = torch.load(p, map_location="cpu", weights_only=True)
    ours = load_state_dict(p)
    assert len(ours) == 24 and sum(v.size for v in ours.values()) == 428738
    _assert_same(ours, ref)
    tree = read_pickle(p)
    strided = [k for k, t in tree.items() if not t.is_contiguous]
    assert sorted(strided) == [f"encoder.fsmn.{i}.fsmn_block.conv_left.weight" for i in range(4)]
    assert tree["encoder.fsmn.0.fsmn_block.conv_left.weight"].stride == (1, 128, 128, 1)
    # ignoring the strides scrambles the taps (docs/model.md, FSMN-VAD): make sure this file would catch that
    w = tree["encoder.fsmn.0.fsmn_block.conv_left.weight"]
    naive = w._storage.array()[: 128 * 20].reshape(128, 1, 20, 1)
    assert np.abs(naive - ref["encoder.fsmn.0.fsmn_block.conv_left.weight"].numpy()).max() > 0.1


# --- refusals -------------------------------------------------------------------------------------


def _zip_with_pickle(path: Path, pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        for k, v in (storages or {}).items():
            z.writestr(f"archive/data/{k}", v)
    return path


class _Reduce:
    def __init__(self, fn, args) -> None:  # noqa: ANN001
        self.fn, self.args = fn, args

    def __reduce__(self):  # noqa: ANN204
        return self.fn, self.args


@pytest.mark.parametrize("how", ["os.system", "posix.system", "builtins.eval", "nested", "subprocess"])
def test_malicious_pickle_is_refused_without_running(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "pwned"
    cmd = f"touch {marker}"
    if how == "os.system":
        pkl = b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd.encode() + b"\x85R."
        name = "os.system"
    elif how == "posix.system":
        pkl = pickle.dumps(_Reduce(os.system, (cmd,)), protocol=2)  # pickles as posix.system on Linux
        name = f"{os.system.__module__}.system"
    elif how == "builtins.eval":
        pkl = pickle.dumps(_Reduce(eval, (f"__import__('os').system({cmd!r})",)), protocol=2)
        name = "builtins.eval"
    elif how == "nested":  # a legitimate-looking state_dict with the payload as one of its values
        sd = collections.OrderedDict(w=1, x=_Reduce(os.system, (cmd,)))
        pkl = pickle.dumps(sd, protocol=2)
        name = f"{os.system.__module__}.system"
    else:
        import subprocess

        pkl = pickle.dumps(_Reduce(subprocess.call, (["touch", str(marker)],)), protocol=4)
        name = "subprocess.call"
    # the payload is real: plain pickle would run it
    assert name.rsplit(".", 1)[1] in ("system", "eval", "call")
    p = _zip_with_pickle(tmp_path / "evil.pt", pkl)
    for fn in (read_pickle, load_state_dict):
        with pytest.raises(ModelFileError, match=rf"global '{name}'"):
            fn(p)
    assert not marker.exists()


def _u(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


@pytest.mark.parametrize("pkl", [
    b"\x80\x02ctorch\nFloatStorage\n}" + _u("np_dtype") + _u("<f8") + b"sb.",  # BUILD with a dict state
    b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(N}" + _u("__defaults__") + b")stb.",  # BUILD with slot state
])
def test_build_cannot_tamper_with_the_reader(tmp_path: Path, pkl: bytes) -> None:
    with pytest.raises(ModelFileError, match="refused"):
        read_pickle(_zip_with_pickle(tmp_path / "tamper.pt", pkl))
    # and the reader still works afterwards
    p = _save({"a": torch.arange(3, dtype=torch.float32)}, tmp_path / "ok.pt")
    np.testing.assert_array_equal(load_state_dict(p)["a"], np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("layout", [
    ((0, (11,), (1,)), "reads element 10"),  # one past the end
    ((5, (2, 3), (3, 1)), "reads element 10"),  # offset + strides past the end
    ((0, (4, 4), (0, 1)), "more elements than its storage"),  # expanded view
    ((-1, (2,), (1,)), "offset must be an int >= 0"),
    ((0, (2, 2), (1, -1)), "negative"),
    ((0, (2, 2), (1,)), "differ in length"),
])
def test_out_of_bounds_tensor_is_refused(tmp_path: Path, layout) -> None:  # noqa: ANN001
    (offset, size, stride), msg = layout

    class _Tag:
        pass

    tag = _Tag()

    class P(pickle.Pickler):
        def persistent_id(self, obj):  # noqa: ANN001, ANN202
            return ("storage", torch.FloatStorage, "0", "cpu", 10) if obj is tag else None

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"w": _Reduce(torch._utils._rebuild_tensor_v2,
                                          (tag, offset, size, stride, False, collections.OrderedDict()))})
    p = _zip_with_pickle(tmp_path / "oob.pt", buf.getvalue(), {"0": np.arange(10, dtype="<f4").tobytes()})
    with pytest.raises(ModelFileError, match=msg):
        load_state_dict(p)


def test_other_refusals(tmp_path: Path) -> None:
    legacy = _save({"a": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(ModelFileError, match="legacy"):
        load_state_dict(legacy)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"hello world")
    with pytest.raises(ModelFileError, match="not a zip"):
        load_state_dict(junk)
    with pytest.raises(ModelFileError, match="no such file"):
        load_state_dict(tmp_path / "missing.pt")
    # storage shorter than declared
    p = _save({"a": torch.ones(4)}, tmp_path / "short.pt")
    short = _rewrite_zip(p, tmp_path / "short2.pt", replace={"data/0": lambda d: d[:8]})
    with pytest.raises(ModelFileError, match="holds 8 bytes"):
        load_state_dict(short)
    # storage key escaping the archive
    class P(pickle.Pickler):
        def persistent_id(self, obj):  # noqa: ANN001, ANN202
            return ("storage", torch.FloatStorage, "../x", "cpu", 1) if obj == "S" else None

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"w": _Reduce(torch._utils._rebuild_tensor_v2, ("S", 0, (1,), (1,), False, None))})
    with pytest.raises(ModelFileError, match="bad storage key"):
        load_state_dict(_zip_with_pickle(tmp_path / "key.pt", buf.getvalue()))
    # a checkpoint that is not a state_dict
    with pytest.raises(ModelFileError, match="not a state_dict"):
        load_state_dict(_save([torch.ones(1)], tmp_path / "list.pt"))


@pytest.fixture(scope="module")
def fsmn_vad_model() -> Path:
    from vad_fixture import fsmn_vad_dir

    return fsmn_vad_dir()
