"""The records of prepare-data's sources: each says what its source writes, and that is what the source writes (the
address covers only those modalities, so a record that forgot one would leave configs with and without it on one
address); a record that cannot be right is refused; an unknown source name is an error naming the setting."""

from __future__ import annotations

import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.data.ingest import ImageFolder, iter_webdataset_tar
from fourm_kfp.data.photo_sources import IMAGE_FOLDER, WEBDATASET
from fourm_kfp.data.source_record import Source
from fourm_kfp.data.sources import SOURCES, UnknownSourceError, source_of
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.data.synthetic_source import SYNTHETIC
from fourm_kfp.storage import open_store
from tests.photos import make_tar, write_photo_folder


@pytest.mark.parametrize("index", range(4))
def test_the_synthetic_scenes_write_exactly_their_record_s_modalities(index):
    assert list(synthetic_sample(seed=0, index=index, image_size=32)) == list(SYNTHETIC.modalities)


def test_a_captioned_photo_holds_exactly_the_photo_sources_modalities(tmp_path):
    folder = write_photo_folder(tmp_path / "photos", good=1)
    listing = ImageFolder(open_store(str(folder)), 32)
    [entry] = listing.entries
    assert set(listing.load(entry).sample) == set(IMAGE_FOLDER.modalities)
    png = tmp_path / "one.png"
    Image.new("RGB", (40, 30), "red").save(png)
    wds = open_store(str(tmp_path / "wds"), create=True)
    wds.put_bytes("0.tar", make_tar([("a.png", png.read_bytes()), ("a.txt", b"a red square")]))
    [item] = iter_webdataset_tar(wds, "0.tar", 32)
    assert set(item.sample) == set(WEBDATASET.modalities)


def test_every_source_of_the_table_is_under_its_own_name():
    assert all(name == source.name for name, source in SOURCES.items())
    assert next(iter(SOURCES)) == load_config("smoke").prepare_data.source == "synthetic"


def test_an_unknown_source_is_an_error_naming_the_setting_and_the_sources():
    with pytest.raises(ConfigError, match=r"prepare_data\.source: 'parquet' is not one of \['synthetic', "
                                          r"'image_folder', 'webdataset'\]"):
        load_config("smoke", overrides=["prepare_data.source=parquet"])
    with pytest.raises(UnknownSourceError, match=r"prepare_data\.source: unknown source 'parquet'; the sources are "
                                                 r"synthetic, image_folder, webdataset"):
        source_of("parquet")


def test_an_external_source_needs_its_uri():
    with pytest.raises(ConfigError, match="source_uri is required when source is 'webdataset'"):
        load_config("smoke", overrides=["prepare_data.source=webdataset"])


def test_a_record_that_cannot_be_right_is_refused():
    def nothing(*args):
        raise AssertionError("not called")

    with pytest.raises(ValueError, match=r"source 'lidar': modalities \['point_cloud'\] are not in the modality"):
        Source("lidar", "a lidar", ("rgb", "point_cloud"), nothing, nothing)
    with pytest.raises(ValueError, match="source 'scans' reads outside the config .* but has no fingerprint"):
        Source("scans", "scanned photos", ("rgb",), nothing, nothing, external=True)
