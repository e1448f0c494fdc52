"""A controller-mode member's broker id on disk (broker/broker_metadata.py): kept across
restarts, written atomically, and refused with a clear error when damaged or of another
group."""

from __future__ import annotations

import pytest

from hamq.broker.broker_metadata import (
    APPLIED,
    APPLYING,
    FILE_NAME,
    BrokerMetadata,
    BrokerMetadataError,
    BrokerMetadataFile,
    new_register_check_code,
)


def test_saved_id_is_loaded_back_and_can_be_forgotten(tmp_path):
    file = BrokerMetadataFile(tmp_path)
    assert file.load("c", "g") is None
    meta = BrokerMetadata("c", "g", 3, new_register_check_code(), APPLYING)
    file.save(meta)
    assert file.load("c", "g") == meta and not meta.applied
    file.save(BrokerMetadata("c", "g", 3, meta.register_check_code, APPLIED))
    assert BrokerMetadataFile(tmp_path).load("c", "g").applied  # a restart reads it
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no temporary file left
    file.remove()
    assert file.load("c", "g") is None
    assert new_register_check_code() != meta.register_check_code


def test_another_groups_or_a_damaged_file_is_refused(tmp_path):
    file = BrokerMetadataFile(tmp_path)
    file.save(BrokerMetadata("c", "other", 2, "code", APPLIED))
    with pytest.raises(BrokerMetadataError, match=r"group c/other.*configured as c/g"):
        file.load("c", "g")
    for damaged in (b"{not json", b'{"broker_id": 1}', b"[]"):
        (tmp_path / FILE_NAME).write_bytes(damaged)
        with pytest.raises(BrokerMetadataError, match="not a valid broker metadata file"):
            file.load("c", "g")
