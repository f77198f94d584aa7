"""lab.core.errors.reject_unknown: the one check every TOML table of the lab's inputs uses for
unknown keys (board profiles' [kernel], [storage], [link], [os], references; inventories)."""

from __future__ import annotations

import pytest

from lab.core.errors import ConfigError, reject_unknown
from lab.model.storageprofile import STORAGE_FIELDS


def test_known_keys_pass():
    reject_unknown({"a": 1, "b": 2}, ["a", "b", "c"], source="f.toml")


def test_names_every_unknown_key_the_first_as_field_and_the_accepted_in_order():
    with pytest.raises(ConfigError) as e:
        reject_unknown({"zz": 1, "a": 2, "yy": 3}, ["c", "a", "b"], source="f.toml", where="t")
    assert e.value.source == "f.toml" and e.value.field == "t.yy"
    assert "unknown fields yy, zz" in e.value.message
    assert e.value.message.endswith("accepted: c, a, b")
    assert "did you mean" not in e.value.message  # no near miss, no guess


def test_a_near_miss_gets_a_suggestion():
    with pytest.raises(ConfigError) as e:
        reject_unknown({"treading": 1}, ["threading", "crypto", "source"], source="p.toml")
    assert e.value.field == "treading"
    assert "'treading': did you mean 'threading'?" in e.value.message


def test_a_key_without_its_unit_suffix_gets_the_same_suggestion_as_did_you_mean():
    # difflib alone rates 'rate' ~0.62 like 'rate_mbit': below reject_unknown's ratio, yet
    # did_you_mean (plan keys) suggested it; both read near_misses now
    from lab.core.errors import did_you_mean

    with pytest.raises(ConfigError) as e:
        reject_unknown({"rate": 1}, ["rate_mbit", "crypto"], source="p.toml")
    assert "'rate': did you mean 'rate_mbit'?" in e.value.message
    assert did_you_mean("rate", ["rate_mbit", "crypto"]) == " (did you mean 'rate_mbit'?)"


def test_a_board_profile_storage_typo_goes_through_it(tmp_path):
    from lab.model.storageprofile import parse_storage

    with pytest.raises(ConfigError) as e:
        parse_storage({"dirty_limit_mb": 1}, "pi4.toml")
    assert e.value.field.startswith("storage.")
    assert ", ".join(STORAGE_FIELDS) in e.value.message
