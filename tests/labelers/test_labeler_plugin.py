"""A labeler plug-in (the example package examples/fourm-kfp-tiny-depth) is found through its entry point, loads its
weights from a local path or an ``s3://`` URI and nowhere else, and labels what its network computes.

Nothing is installed: the test writes the ``*.dist-info`` folder pip would write (its ``entry_points.txt`` from the
example's own pyproject.toml) into a temporary folder and puts that folder and the example's ``src/`` on
``sys.path``, which is all ``importlib.metadata`` and the import system look at.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from fourm_kfp.labelers.base import LabelBatch, LabelerError, label_one_by_one
from fourm_kfp.labelers.registry import ENTRY_POINT_GROUP, available_labelers, build_labeler
from fourm_kfp.labelers.weights import file_digest
from fourm_kfp.storage import open_store
from tests.labeler_plugins import expose_entry_points

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fourm-kfp-tiny-depth"


def make_plugin_visible(folder: Path, monkeypatch) -> None:
    """What ``pip install examples/fourm-kfp-tiny-depth`` makes visible, without installing it."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    expose_entry_points(folder, monkeypatch, project["name"], project["version"],
                        project["entry-points"][ENTRY_POINT_GROUP])
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))


@pytest.fixture
def tiny_depth(tmp_path, monkeypatch):
    """The example plug-in, visible to the registry; the weights cache in a fresh folder. Returns its module."""
    make_plugin_visible(tmp_path / "site", monkeypatch)
    monkeypatch.setenv("FOURM_LABELER_CACHE", str(tmp_path / "weights-cache"))
    import fourm_kfp_tiny_depth

    return fourm_kfp_tiny_depth


class NetworkGuard:
    """``socket.socket.connect`` refused, and recorded, for any address but loopback (and Unix sockets)."""

    def __init__(self) -> None:
        self.refused: list[object] = []

    @staticmethod
    def local(address: object) -> bool:
        if not isinstance(address, tuple):
            return True  # a Unix socket path
        host = address[0]
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False  # a host name: it would need the network to resolve

    def install(self, monkeypatch) -> None:
        for method in ("connect", "connect_ex"):
            original = getattr(socket.socket, method)

            def guarded(sock, address, _original=original):
                if not self.local(address):
                    self.refused.append(address)
                    raise OSError(f"test: no network beyond loopback (tried {address})")
                return _original(sock, address)

            monkeypatch.setattr(socket.socket, method, guarded)


@pytest.fixture
def no_network(monkeypatch) -> NetworkGuard:
    guard = NetworkGuard()
    guard.install(monkeypatch)
    return guard


def images(seed: int = 0) -> LabelBatch:
    """Three 20 px images and one 12×16 one (a second forward pass)."""
    rng = np.random.default_rng(seed)
    square = [rng.integers(0, 256, (20, 20, 3), dtype=np.uint8) for _ in range(3)]
    return LabelBatch(("a", "b", "odd", "c"), (square[0], square[1], rng.integers(0, 256, (12, 16, 3), np.uint8),
                                               square[2]))


def direct_forward(module, weights: Path, batch: LabelBatch) -> list[np.ndarray]:
    """The network with the saved weights, run by hand: one pass over the 20 px images, one over the odd one."""
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(weights))
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    net = module.TinyDepthNet()
    net.load_state_dict(state)
    net.eval()

    def run(arrays):
        with torch.no_grad():
            x = torch.tensor(np.stack(arrays), dtype=torch.float32).permute(0, 3, 1, 2).contiguous() / 255.0
            return list(net(x).numpy())

    square = run([batch.images[i] for i in (0, 1, 3)])
    return [square[0], square[1], run([batch.images[2]])[0], square[2]]


def assert_close(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == np.float32 and a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_the_plugin_is_listed_once_its_entry_point_is_visible(tmp_path, monkeypatch):
    assert "tiny_depth" not in available_labelers()
    with pytest.raises(LabelerError, match="unknown labeler 'tiny_depth'"):
        build_labeler("tiny_depth")
    make_plugin_visible(tmp_path, monkeypatch)
    assert "tiny_depth" in available_labelers()
    assert {"canny_edge", "color_palette", "metadata"} <= set(available_labelers())


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_plugin_labels_equal_a_direct_forward_pass_of_its_saved_weights(tiny_depth, tmp_path, no_network, suffix):
    weights = tmp_path / f"tiny{suffix}"
    tiny_depth.save_random_network(weights, seed=0)
    labeler = build_labeler("tiny_depth", weights=str(weights))
    assert labeler.modality == "depth" and labeler.needs_weights and labeler.wants_accelerator
    assert labeler.identity()["weights"] == file_digest(weights)
    batch = images()
    values = labeler.label(batch)
    expected = direct_forward(tiny_depth, weights, batch)
    assert_close(values, expected)
    assert all(np.array_equal(a, b) for a, b in zip(values, labeler.label(batch), strict=True))  # deterministic
    assert_close(label_one_by_one(labeler, batch), values)  # batched = one by one, up to float rounding
    assert_close(build_labeler("tiny_depth", {"batch_size": 2}, weights=str(weights)).label(batch), values)
    other = tmp_path / f"other{suffix}"
    tiny_depth.save_random_network(other, seed=1)
    assert not np.allclose(direct_forward(tiny_depth, other, batch)[0], values[0], atol=1e-3)  # weights matter
    assert not no_network.refused


def test_plugin_weights_from_s3_with_no_network_beyond_the_local_server(tiny_depth, tmp_path, s3_uri, no_network):
    weights = tmp_path / "tiny.pt"
    tiny_depth.save_random_network(weights, seed=0)
    open_store(s3_uri).put_file("teachers/tiny.pt", weights)
    labeler = build_labeler("tiny_depth", weights=f"{s3_uri}/teachers/tiny.pt")
    assert labeler.setup.weights_path.startswith(str(tmp_path / "weights-cache"))
    assert labeler.identity()["weights"] == file_digest(weights)
    batch = images(1)
    assert_close(labeler.label(batch), direct_forward(tiny_depth, weights, batch))
    assert not no_network.refused


def test_the_network_guard_refuses_a_remote_address(no_network):
    with socket.socket() as sock, pytest.raises(OSError, match="no network beyond loopback"):
        sock.connect(("192.0.2.1", 443))  # TEST-NET-1: never routable
    assert no_network.refused == [("192.0.2.1", 443)]


def test_a_missing_weights_file_is_an_error_naming_its_uri(tiny_depth, tmp_path, s3_uri):
    for uri in (str(tmp_path / "nowhere.pt"), f"{s3_uri}/teachers/nowhere.pt"):
        with pytest.raises(LabelerError, match=rf"labeler 'tiny_depth'.*weights file {re.escape(uri)} does not exist"):
            build_labeler("tiny_depth", weights=uri)
    with pytest.raises(LabelerError, match=r"labeler 'tiny_depth'.*needs weights"):
        build_labeler("tiny_depth")


def test_unreadable_or_mismatched_weights_are_an_error_naming_the_file(tiny_depth, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a state dict")
    with pytest.raises(LabelerError, match=rf"labeler 'tiny_depth'.*cannot load weights {re.escape(str(garbage))}"):
        build_labeler("tiny_depth", weights=str(garbage))
    narrow = tmp_path / "narrow.pt"
    tiny_depth.save_random_network(narrow, width=8)
    with pytest.raises(LabelerError, match=r"cannot load weights .*narrow\.pt \(width 16\)"):
        build_labeler("tiny_depth", weights=str(narrow))
    assert build_labeler("tiny_depth", {"width": 8}, weights=str(narrow)).label(images())[0].shape == (20, 20)


def test_new_weights_in_the_same_file_change_the_identity_and_the_labels(tiny_depth, tmp_path):
    weights = tmp_path / "tiny.pt"
    tiny_depth.save_random_network(weights, seed=0)
    before = build_labeler("tiny_depth", weights=str(weights))
    tiny_depth.save_random_network(weights, seed=1)
    after = build_labeler("tiny_depth", weights=str(weights))
    assert before.identity()["weights"] != after.identity()["weights"] == file_digest(weights)
    assert {k: v for k, v in before.identity().items() if k != "weights"} == {
        k: v for k, v in after.identity().items() if k != "weights"}
    assert not np.allclose(before.label(images())[0], after.label(images())[0], atol=1e-3)


def test_new_weights_in_the_same_file_move_the_label_stage_and_what_reads_it(tiny_depth, tmp_path):
    """The config names the same path before and after: only the file's digest tells the two teachers apart."""
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.contract.addressing import stage_address
    from fourm_kfp.stages import get_stage

    weights, photos = tmp_path / "tiny.pt", tmp_path / "photos"
    photos.mkdir()
    modalities = "[rgb, caption, depth]"
    config = load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={photos}", f"data.modalities={modalities}",
        f"data.input_modalities={modalities}", f"data.target_modalities={modalities}",
        f"label.labelers=[{{name: tiny_depth, weights: '{weights}'}}]"])
    tiny_depth.save_random_network(weights, seed=0)
    before = {name: stage_address(get_stage(name), config) for name in ("prepare-data", "label", "pretrain")}
    tiny_depth.save_random_network(weights, seed=1)
    after = {name: stage_address(get_stage(name), config) for name in ("prepare-data", "label", "pretrain")}
    assert before["label"] != after["label"] and before["pretrain"] != after["pretrain"]
    assert before["prepare-data"] == after["prepare-data"]
    weights.unlink()
    with pytest.raises(LabelerError, match=re.escape(f"label.labelers[0]: weights file {weights} does not exist")):
        stage_address(get_stage("label"), config)


def test_new_weights_at_the_same_s3_uri_change_the_identity(tiny_depth, tmp_path, s3_uri):
    store = open_store(s3_uri)
    weights = tmp_path / "tiny.pt"
    tiny_depth.save_random_network(weights, seed=0)
    store.put_file("tiny.pt", weights)
    before = build_labeler("tiny_depth", weights=f"{s3_uri}/tiny.pt").identity()["weights"]
    tiny_depth.save_random_network(weights, seed=1)  # same architecture: a file of the same size
    store.put_file("tiny.pt", weights)
    after = build_labeler("tiny_depth", weights=f"{s3_uri}/tiny.pt").identity()["weights"]
    assert before != after == file_digest(weights)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_plugin_runs_on_the_setup_device(tiny_depth, tmp_path):
    weights = tmp_path / "tiny.pt"
    tiny_depth.save_random_network(weights, seed=0)
    on_gpu = build_labeler("tiny_depth", weights=str(weights), device="cuda")
    assert next(on_gpu.net.parameters()).is_cuda
    values = on_gpu.label(images())
    assert all(v.dtype == np.float32 for v in values)
    for gpu, cpu in zip(values, build_labeler("tiny_depth", weights=str(weights)).label(images()), strict=True):
        np.testing.assert_allclose(gpu, cpu, rtol=5e-3, atol=5e-3)  # cuDNN may convolve in TF32
