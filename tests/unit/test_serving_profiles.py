from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.serving.tier.profiles import (
    builtin_profile_names,
    load_profile,
    profile_diff,
    profile_from_dict,
    resolve_profile,
)
from tailguard.serving.tier.yamlfile import ConfigFileError


def test_shipped_profiles_load() -> None:
    names = builtin_profile_names()
    assert {"stable", "bad-max-num-seqs", "small-kv-cache"} <= set(names)
    for name in names:
        assert resolve_profile(name).name == name
    assert resolve_profile("bad-max-num-seqs").engineArgs.max_num_seqs == 2
    assert resolve_profile("small-kv-cache").num_gpu_blocks() == 48


def test_unknown_engine_arg_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nmodel: m\nengineArgs:\n  max_num_seqs: 8\n  max_num_seq: 2\n")
    with pytest.raises(ConfigFileError) as error:
        load_profile(path)
    assert str(error.value) == f"{path}:5: engineArgs.max_num_seq: unknown field"


def test_wrong_type_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nmodel: m\nengineArgs:\n  gpu_memory_utilization: lots\n")
    with pytest.raises(ConfigFileError) as error:
        load_profile(path)
    assert error.value.line == 4 and error.value.field == "engineArgs.gpu_memory_utilization"


def test_duplicate_keys_and_bad_yaml_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nname: y\nmodel: m\n")
    with pytest.raises(ConfigFileError, match=r"p.yaml:2: name: duplicate key"):
        load_profile(path)
    # A nested duplicate is named by its full path, as the policy loader names it.
    path.write_text("name: x\nmodel: m\nengineArgs:\n  max_num_seqs: 8\n  max_num_seqs: 2\n")
    with pytest.raises(ConfigFileError, match=r"p.yaml:5: engineArgs.max_num_seqs: duplicate key"):
        load_profile(path)
    path.write_text("name: [x\n")
    with pytest.raises(ConfigFileError, match="invalid YAML"):
        load_profile(path)


def test_profile_diff_lists_changed_engine_args() -> None:
    diff = profile_diff(resolve_profile("stable"), resolve_profile("bad-max-num-seqs"))
    assert diff == {"max_num_seqs": {"from": 64, "to": 2}}
    assert profile_diff(resolve_profile("stable"), resolve_profile("stable")) == {}


def test_profile_from_dict_rejects_bad_values() -> None:
    with pytest.raises(ConfigFileError, match="engineArgs.max_num_seqs"):
        profile_from_dict({"name": "x", "model": "m", "engineArgs": {"max_num_seqs": 0}})
