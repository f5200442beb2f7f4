"""The views of `NodeSettings` by concern (settings/views.py): each field the setting of
its name, of its type, and the value the operator set; the variables still flat."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from tuneplane_node.settings import (
    ImageSettings,
    LifecycleSettings,
    NodeSettings,
    ObserveSettings,
    VolumeSettings,
    env_name,
    load_settings,
)

VIEWS = {
    "images": ImageSettings,
    "volumes": VolumeSettings,
    "lifecycle": LifecycleSettings,
    "observe": ObserveSettings,
}


def setting_type(name: str) -> object:
    """The type of a setting: a field's annotation, or a property's return."""
    if name in NodeSettings.model_fields:
        return NodeSettings.model_fields[name].annotation
    read = getattr(NodeSettings, name, None)
    assert isinstance(read, property), f"{name} is no setting of NodeSettings"
    return typing.get_type_hints(read.fget)["return"]


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_each_field_of_a_view_is_the_setting_of_its_name_and_type(view: str) -> None:
    """So ``env_name(field)`` is the variable a collaborator's message names, and the copy
    by name (`made_from`) hands over what mypy was told."""
    hints = typing.get_type_hints(VIEWS[view])
    for field in dataclasses.fields(VIEWS[view]):
        expected = setting_type(field.name)
        if typing.get_origin(expected) is list:  # a view holds a tuple: it is read-only
            (item,) = typing.get_args(expected)
            expected = tuple[item, ...]  # type: ignore[valid-type]  # a type made at run time
        assert hints[field.name] == expected, f"{view}.{field.name}"


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_view_is_read_only(view: str) -> None:
    made = getattr(load_settings(local_stop_timeout=30), view)
    assert isinstance(made, VIEWS[view])
    assert dataclasses.is_dataclass(made)
    field = dataclasses.fields(made)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, field, None)


def test_a_view_holds_what_the_operator_set_under_the_flat_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.setenv(env_name("image_gc_high_percent"), "70")
    monkeypatch.setenv(env_name("image_gc_low_percent"), "60")
    monkeypatch.setenv(env_name("volume_insecure_hosts"), '["Mirror.lan:5000"]')
    monkeypatch.setenv(env_name("local_stop_timeout"), "7")
    monkeypatch.setenv(env_name("node_state_dir"), str(tmp_path / "state"))
    settings = load_settings(volume_root=None)
    assert settings.images.image_gc_high_percent == 70
    assert settings.images.image_gc_low_percent == 60
    assert settings.images.state_dir == tmp_path / "state"
    assert settings.volumes.volume_insecure_hosts == ("mirror.lan:5000",)
    assert settings.volumes.volume_dir == tmp_path / "state" / "volumes"
    assert settings.lifecycle.local_stop_timeout == 7


def test_a_view_is_made_when_read_so_a_copy_of_the_settings_has_its_own() -> None:
    settings = load_settings(local_stop_timeout=30)
    assert settings.lifecycle.local_stop_timeout == 30
    copy = settings.model_copy(update={"local_stop_timeout": 0})
    assert copy.lifecycle.local_stop_timeout == 0
    assert settings.lifecycle.local_stop_timeout == 30
