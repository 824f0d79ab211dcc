"""Files named by configs, checkpoints and manifests: a named pipe (which would block its reader
forever), a device (which never ends) or a folder is refused before a byte is read; archives and
audio are checked from their headers before anything is allocated."""

import io
import os
import zipfile

import numpy as np
import pytest

from lightning_gtn.files import npy_data, npy_header, open_regular, read_regular


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe.txt"
    os.mkfifo(p)  # nobody writes: a blocking open or read would hang the test (pytest-timeout)
    return p


def test_open_regular_refuses_pipes_devices_and_folders(tmp_path, fifo):
    for p in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(ValueError, match="not a regular file"):
            open_regular(p, "thing")
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular(link, "thing", 100)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent", "thing")
    (tmp_path / "ok").write_text("hello")
    assert read_regular(tmp_path / "ok", "thing", 5) == b"hello"
    with pytest.raises(ValueError, match="larger than 4 bytes"):
        read_regular(tmp_path / "ok", "thing", 4)
    with open_regular(tmp_path / "ok", "thing", "r", encoding="utf-8") as f:
        assert f.read() == "hello"


def test_readers_of_named_files_refuse_a_pipe(fifo):
    from lightning_gtn import wfst
    from lightning_gtn.lm import read_arpa, read_lexicon
    from lightning_gtn.wordpieces import load_word_pieces

    for read in (read_arpa, read_lexicon, load_word_pieces, wfst.load, wfst.loadtxt):
        with pytest.raises(ValueError, match="not a regular file"):
            read(str(fifo))


def test_npy_header_first(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3))
    buf.seek(0)
    shape, fortran, dtype = npy_header(buf, "x")
    a = npy_data(buf, shape, fortran, dtype, "x")
    assert a.flags.writeable and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    buf.seek(0)
    with pytest.raises(ValueError, match="objects and records are not read"):
        npy_header(buf, "x")


def _npz(path, **members):
    """An .npz whose members are raw bytes (headers that lie about their data)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for k, v in members.items():
            z.writestr(k + ".npy", v)
    return str(path)


def _header(shape, descr="<f4"):
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode()


def test_feature_files_are_read_header_first(tmp_path, fifo):
    from lightning_gtn.lightning import FeatureDataModule

    tx = tmp_path / "t.txt"
    tx.write_text("u1 ab\n")

    def load(path):
        FeatureDataModule(str(path), str(tx), str(path), str(tx)).setup("fit")

    # a deflated member of zeros whose header declares 40 GB: refused before a byte is inflated
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("u1.npy", "w", force_zip64=True) as m:
            m.write(_header((1 << 30, 10)))
            m.write(bytes(1 << 20))
    with pytest.raises(ValueError, match=r"shape \(1073741824, 10\): at most .* values in a split"):
        load(tmp_path / "bomb.npz")
    with pytest.raises(ValueError, match="truncated"):
        load(_npz(tmp_path / "short.npz", u1=_header((5, 8)) + bytes(10)))
    with pytest.raises(ValueError, match="must be a real array of shape"):
        load(_npz(tmp_path / "three.npz", u1=_header((5, 8, 2))))
    np.save(tmp_path / "plain.npy", np.zeros((5, 8), np.float32))
    with pytest.raises(ValueError, match="not an .npz archive"):
        load(tmp_path / "plain.npy")
    np.savez(tmp_path / "nan.npz", u1=np.full((5, 8), np.nan, np.float32))
    with pytest.raises(ValueError, match="NaN or infinite features"):
        load(tmp_path / "nan.npz")
    with pytest.raises(ValueError, match="not a regular file"):
        load(fifo)
    np.savez(tmp_path / "good.npz", u1=np.ones((5, 8), np.float64))
    dm = FeatureDataModule(str(tmp_path / "good.npz"), str(tx), str(tmp_path / "good.npz"), str(tx))
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))["inputs"].shape == (1, 5, 8)


def test_audio_rates_that_need_a_huge_resampling_filter_are_refused(tmp_path, fifo):
    sf = pytest.importorskip("soundfile")
    pytest.importorskip("lhotse")
    from lightning_gtn.lightning.speech_sources import cuts_from_folder

    def folder(name, rate):
        d = tmp_path / name
        d.mkdir()
        sf.write(str(d / "u1.wav"), np.zeros(int(rate * 0.1), np.float32), rate)
        (d / "transcripts.txt").write_text("u1 ab\n")
        return d

    assert len(cuts_from_folder(folder("cd", 44100))) == 1  # 441 x 160 phases
    with pytest.raises(ValueError, match=r"8009 Hz to 16000 Hz needs a filter of 8009 x 16000 phases"):
        cuts_from_folder(folder("odd", 8009))
    d = tmp_path / "piped"
    d.mkdir()
    os.mkfifo(d / "u1.wav")
    (d / "transcripts.txt").write_text("u1 ab\n")
    with pytest.raises(ValueError, match="not a regular file"):
        cuts_from_folder(d)


def test_spoken_task_marker_linked_to_a_device_is_not_read(tmp_path):
    pytest.importorskip("lhotse")
    from lightning_gtn.lightning.spoken import _COMPLETE, _is_complete

    (tmp_path / _COMPLETE).symlink_to("/dev/zero")
    assert _is_complete(tmp_path, {}) is False
