"""Real-data ingestion: image normalisation, image folders with captions, WebDataset tars, skip accounting."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.image_normalize import BadSampleError, normalize_image
from fourm_kfp.data.ingest import SkipCounter, TooManyBadSamplesError, iter_image_folder, iter_webdataset
from fourm_kfp.storage import open_store
from tests.photos import make_tar

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def solid(color, size=(32, 32)) -> Image.Image:
    return Image.new("RGB", size, color)


def reason_of(data: bytes, **kwargs) -> str:
    with pytest.raises(BadSampleError) as info:
        normalize_image(data, 32, "x.img", **kwargs)
    assert info.value.name == "x.img"
    return info.value.reason


# --------------------------------------------------------------------------------------------- normalize_image


def test_grayscale_and_1bit_become_equal_channels():
    gray = Image.fromarray(np.tile(np.arange(0, 256, 8, dtype=np.uint8), (32, 1)), "L")
    out = normalize_image(encode(gray), 32, "g.png")
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    assert (out[..., 0] == np.asarray(gray)).all() and (out[..., 0] == out[..., 2]).all()
    bits = normalize_image(encode(Image.new("1", (32, 32), 1)), 32, "b.png")
    assert (bits == 255).all()


def test_transparency_is_composited_over_white():
    rgba = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    rgba.paste((255, 0, 0, 255), (0, 0, 16, 32))
    out = normalize_image(encode(rgba), 32, "a.png")
    assert tuple(out[5, 5]) == RED and tuple(out[5, 25]) == WHITE
    la = normalize_image(encode(Image.new("LA", (32, 32), (0, 0))), 32, "la.png")
    assert (la == 255).all()
    palette = Image.new("P", (32, 32), 0)
    palette.putpalette([0, 0, 255, 0, 255, 0] + [0] * 762)
    palette.paste(1, (0, 0, 32, 16))
    out = normalize_image(encode(palette), 32, "p.png")
    assert tuple(out[0, 0]) == GREEN and tuple(out[31, 0]) == BLUE
    out = normalize_image(encode(palette, transparency=0), 32, "pt.png")
    assert tuple(out[0, 0]) == GREEN and tuple(out[31, 0]) == WHITE


def test_16_bit_is_stretched_to_the_full_8_bit_range():
    values = np.linspace(0, 4000, 32 * 32).reshape(32, 32).astype(np.uint16)
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    out = normalize_image(encode(image), 32, "depth16.png")
    assert out.min() == 0 and out.max() == 255
    assert np.abs(out[..., 0].astype(int) - np.round(values / 4000 * 255)).max() <= 1
    floats = normalize_image(encode(Image.fromarray(values.astype(np.float32) + 1000.0), "TIFF"), 32, "f.tif")
    assert floats.min() == 0 and floats.max() == 255


def test_cmyk_is_converted():
    out = normalize_image(encode(Image.new("CMYK", (32, 32), (255, 0, 0, 0)), "JPEG", quality=100), 32, "c.jpg")
    assert np.abs(out.astype(int) - (0, 255, 255)).max() <= 3


def test_exif_orientation_is_applied():
    stored = solid(WHITE, (64, 32))  # wide as stored; orientation 6 means "turn 90° clockwise to display"
    stored.paste(RED, (26, 0, 38, 10))  # marker at the stored top edge → the displayed right edge
    exif = Image.Exif()
    exif[0x0112] = 6
    out = normalize_image(encode(stored, "JPEG", exif=exif, quality=95), 32, "rot.jpg")
    red = (out[..., 0] > 200) & (out[..., 1] < 80)
    rows, cols = np.nonzero(red)
    assert red.sum() > 50 and cols.min() >= 20 and 10 <= rows.mean() <= 22  # right edge, half-way down
    assert not red[:6, 10:22].any()  # not where it would be without the rotation


def test_resizes_the_shorter_side_and_crops_the_centre():
    bands = solid(RED, (90, 30))
    bands.paste(GREEN, (30, 0, 60, 30))
    bands.paste(BLUE, (60, 0, 90, 30))
    out = normalize_image(encode(bands), 15, "bands.png")
    assert out.shape == (15, 15, 3)
    assert np.abs(out[2:-2, 2:-2].astype(int) - GREEN).max() <= 2
    assert normalize_image(encode(solid(BLUE, (20, 40))), 64, "up.png").shape == (64, 64, 3)


def test_bad_images_are_reported_by_reason(monkeypatch):
    jpeg = encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)), "JPEG")
    assert reason_of(jpeg[: len(jpeg) // 2]) == "truncated"
    assert reason_of(b"this is a text file, not a JPEG\n") == "unreadable"
    assert reason_of(b"") == "unreadable"
    assert reason_of(encode(solid(RED, (8, 40)))) == "too_small"
    assert reason_of(encode(solid(RED, (20, 20))), min_side=24) == "too_small"
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert reason_of(encode(solid(RED, (40, 40)))) == "decompression_bomb"  # Pillow itself only warns here
    assert reason_of(encode(solid(RED, (64, 64)))) == "decompression_bomb"  # and raises here


# ------------------------------------------------------------------------------------------------ image folder


def write(root: Path, name: str, data: bytes | str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "images"
    write(root, "animals/cat.png", encode(solid(RED)))
    write(root, "animals/cat.txt", "  a red cat\n")
    write(root, "b.JPG", encode(solid(GREEN), "JPEG"))
    write(root, "empty.png", encode(solid(BLUE)))
    write(root, "empty.txt", " \n")
    write(root, "latin1.png", encode(solid(BLUE)))
    write(root, "latin1.txt", "caf\xe9".encode("latin-1"))
    write(root, "not_an_image.jpg", "hello")
    write(root, "tiny.gif", encode(solid(RED, (4, 4)), "GIF"))
    write(root, "x.png", encode(solid(WHITE)))
    write(root, "x.webp", encode(solid(WHITE), "WEBP"))
    write(root, ".DS_Store", "junk")
    write(root, "animals/._cat.png", "macOS resource fork")
    write(root, "notes.md", "# not an image")
    return root


def test_image_folder_samples_captions_and_skips(folder):
    items = list(iter_image_folder(open_store(str(folder)), 16))
    by_origin = {Path(i.origin).relative_to(folder).as_posix(): i for i in items}
    assert list(by_origin) == ["animals/cat.png", "b.JPG", "empty.png", "latin1.png", "not_an_image.jpg",
                               "tiny.gif", "x.png", "x.webp"]
    cat = by_origin["animals/cat.png"]
    assert cat.sample["caption"] == "a red cat" and cat.sample["rgb"].shape == (16, 16, 3)
    assert tuple(cat.sample["rgb"][8, 8]) == RED
    assert "caption" not in by_origin["b.JPG"].sample and "caption" not in by_origin["empty.png"].sample
    skipped = {name: i.skipped.reason for name, i in by_origin.items() if i.skipped}
    assert skipped == {"latin1.png": "bad_caption_encoding", "not_an_image.jpg": "unreadable",
                       "tiny.gif": "too_small"}
    assert all((i.sample is None) != (i.skipped is None) for i in items)
    assert str(folder / "not_an_image.jpg") in str(by_origin["not_an_image.jpg"].skipped)


def test_image_folder_keys_are_safe_unique_and_stable(folder):
    write(folder, "a b.png", encode(solid(RED)))
    write(folder, "a_b.png", encode(solid(RED)))
    keys = [i.key for i in iter_image_folder(open_store(str(folder)), 16)]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", k) for k in keys)
    assert "a_b" in keys and "b" in keys and "x" in keys  # names that need no change keep them
    assert keys == [i.key for i in iter_image_folder(open_store(str(folder)), 16)]


def test_captions_from_jsonl_and_csv(folder, tmp_path):
    write(folder, "captions.jsonl", '{"file": "animals/cat.png", "caption": "from jsonl"}\n\n'
                                    '{"image": "./b.JPG", "text": "green", "extra": 1}\n'
                                    '{"path": "x.png", "caption": "  "}\n')
    items = {i.key: i for i in iter_image_folder(open_store(str(folder)), 16, "captions.jsonl")}
    captions = {k: i.sample.get("caption") for k, i in items.items() if i.sample}
    assert captions["b"] == "green" and captions["x"] is None and captions["empty"] is None
    assert [c for k, c in captions.items() if k.startswith("animals")] == ["from jsonl"]  # not the side file
    assert items["latin1"].sample is not None  # side files are not read when a captions file is given

    write(tmp_path, "elsewhere/caps.csv", 'path,caption\nanimals/cat.png,"a cat, red"\nb.JPG,green\n')
    items = {i.key: i for i in iter_image_folder(open_store(str(folder)), 16, str(tmp_path / "elsewhere/caps.csv"))}
    assert items["b"].sample["caption"] == "green"
    assert [i.sample["caption"] for k, i in items.items() if k.startswith("animals")] == ["a cat, red"]


@pytest.mark.parametrize("name, text, where", [
    ("caps.jsonl", '{"file": "b.JPG", "caption": "ok"}\n\n{"file": "x.png", "caption": "no end\n', "caps.jsonl:3"),
    ("caps.jsonl", '{"file": "b.JPG", "caption": "ok"}\n{"file": "x.png"}\n', "caps.jsonl:2"),
    ("caps.jsonl", '["b.JPG", "ok"]\n', "caps.jsonl:1"),
    ("caps.jsonl", '{"file": "b.JPG", "caption": "a"}\n{"file": "b.JPG", "caption": "b"}\n', "caps.jsonl:2"),
    ("caps.csv", "file,description\nb.JPG,green\n", "caps.csv:1"),
    ("caps.csv", "file,caption\nb.JPG,green\nx.png\n", "caps.csv:3"),
    ("caps.csv", "file,caption\nb.JPG,green, and more\n", "caps.csv:2"),
    ("caps.txt", "b.JPG green\n", "caps.txt"),
])
def test_malformed_captions_file_names_file_and_line(folder, name, text, where):
    write(folder, name, text)
    with pytest.raises(ValueError, match=re.escape(str(folder / where))):
        next(iter_image_folder(open_store(str(folder)), 16, name))


# -------------------------------------------------------------------------------------------------- webdataset


def test_webdataset_samples_skips_and_corrupt_tars(any_store_uri):
    store = open_store(any_store_uri, create=True)
    jpg, png = encode(solid(RED), "JPEG"), encode(solid(GREEN))
    meta = {"caption": "from json", "url": "http://example.com/1.png", "width": 32}
    store.put_bytes("00000.tar", make_tar([
        ("shard0/0001.jpg", jpg), ("shard0/0001.txt", b"red square"),
        ("0002.png", png), ("0002.json", json.dumps(meta).encode()),
        ("0003.json", json.dumps(meta).encode()),
        ("0004.jpg", jpg), ("0004.txt", b"the txt wins"), ("0004.json", json.dumps(meta).encode()),
        ("0005.jpg", b"not a jpeg"), ("0005.txt", b"broken"),
    ]))
    good = make_tar([("0006.png", png), ("0006.txt", b"kept"), ("0007.png", png), ("0007.txt", b"lost")])
    with tarfile.open(fileobj=io.BytesIO(good)) as tar:
        cut = tar.getmember("0007.png").offset_data + 50
    store.put_bytes("00001.tar", good[:cut])  # cut inside 0007's image
    store.put_bytes("00002.tar", b"garbage" * 200)
    store.put_bytes("00003.tar", make_tar([("0008.png", png)]))
    store.put_bytes("00000.parquet", b"img2dataset metadata, not a tar")

    items = list(iter_webdataset(store, 16))
    rows = [(i.origin.removeprefix(store.uri + "/"), i.skipped.reason if i.skipped else i.sample.get("caption"))
            for i in items]
    assert rows == [
        ("00000.tar/shard0/0001", "red square"),
        ("00000.tar/0002", "from json"),
        ("00000.tar/0003", "missing_image"),
        ("00000.tar/0004", "the txt wins"),
        ("00000.tar/0005", "unreadable"),
        ("00001.tar/0006", "kept"),
        ("00001.tar", "corrupt_tar"),
        ("00002.tar", "corrupt_tar"),
        ("00003.tar/0008", None),
    ]
    assert tuple(items[0].sample["rgb"][8, 8]) == pytest.approx(RED, abs=8)
    assert "after 1 samples" in items[6].skipped.detail
    keys = [i.key for i in items]
    assert len(set(keys)) == len(keys) and all(re.fullmatch(r"[A-Za-z0-9_-]+", k) for k in keys)
    assert keys[1] == "0002" and keys[0].startswith("shard0_0001-")
    assert keys == [i.key for i in iter_webdataset(store, 16)]


# ------------------------------------------------------------------------------------------------ SkipCounter


def test_skip_counter_threshold_and_message():
    skips = SkipCounter(keep=2)
    for i, reason in enumerate(["truncated", "unreadable", "truncated"]):
        skips.add(BadSampleError(reason, f"s3://bucket/img{i}.jpg", "detail"))
    assert skips.total == 3
    summary = skips.as_dict()
    assert summary["by_reason"] == {"truncated": 2, "unreadable": 1} and len(summary["first"]) == 2
    skips.check(30, 0.1, where="prepare-data source s3://bucket")  # exactly 10%: allowed
    with pytest.raises(TooManyBadSamplesError) as info:
        skips.check(10, 0.1, where="prepare-data source s3://bucket")
    message = str(info.value)
    for part in ("prepare-data source s3://bucket", "3 of 10", "30.00%", "prepare_data.max_bad_fraction=0.1",
                 "truncated=2", "s3://bucket/img0.jpg: truncated", "s3://bucket/img1.jpg: unreadable"):
        assert part in message
    assert "img2.jpg" not in message
    SkipCounter().check(0, 0.0, where="empty source")


@pytest.mark.parametrize("workers", [1, 3])
def test_parallel_decoding_keeps_order_keys_and_skips(tmp_path, workers):
    """Threads decode ahead, but items, keys and skip records come out exactly as with one worker."""
    import tarfile as tar_module

    from fourm_kfp.data.ingest import ordered_map

    for i in range(12):
        Image.new("RGB", (20 + i, 24), (10 * i, 0, 0)).save(tmp_path / f"img{i:02d}.png")
    (tmp_path / "img05.png").write_bytes(b"broken")
    store = open_store(str(tmp_path))
    serial = [(i.key, i.skipped.reason if i.skipped else None) for i in iter_image_folder(store, 16)]
    parallel = [(i.key, i.skipped.reason if i.skipped else None) for i in iter_image_folder(store, 16,
                                                                                               workers=workers)]
    assert parallel == serial and serial[5] == ("img05", "unreadable")

    def failing_source():
        yield from range(5)
        raise tar_module.ReadError("cut")

    got = []
    with pytest.raises(tar_module.ReadError):
        for value in ordered_map(lambda x: x * 10, failing_source(), workers):
            got.append(value)
    assert got == [0, 10, 20, 30, 40]  # what was read before the failure still comes out
