"""Settings for a standby coordinator and for several coordinator addresses (issue 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.config.loading import load_settings
from gpuq.config.settings import Settings, split_addresses
from gpuq.config.value_checks import check_setting
from gpuq.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUQ_CONFIG", "GPUQ_DATABASE_URL", "GPUQ_COORDINATOR", "GPUQ_HOME"):
        monkeypatch.delenv(var, raising=False)


def settings_from(tmp_path: Path, text: str) -> Settings:
    (tmp_path / "config.toml").write_text(text)
    return load_settings(home=tmp_path)


def test_standby_is_off_by_default_and_a_boolean(tmp_path: Path) -> None:
    assert settings_from(tmp_path, "").coordinator.standby is False
    assert settings_from(tmp_path, "[coordinator]\nstandby = true\n").coordinator.standby
    with pytest.raises(ConfigError, match=r"\[coordinator\] standby.*true or false"):
        settings_from(tmp_path, '[coordinator]\nstandby = "yes"\n')


def test_several_coordinator_addresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(tmp_path, '[agent]\ncoordinator = "head:7817, spare:7817"\n')
    assert settings.coordinator_address == "head:7817,spare:7817"
    assert split_addresses(settings.coordinator_address) == ["head:7817", "spare:7817"]
    monkeypatch.setenv("GPUQ_COORDINATOR", "unix:/run/gpuq.sock,head:7817")
    assert split_addresses(load_settings(home=tmp_path).coordinator_address) == [
        "unix:/run/gpuq.sock",
        "head:7817",
    ]
    assert split_addresses("unix:/x/gpuq.sock") == ["unix:/x/gpuq.sock"]


@pytest.mark.parametrize("value", ["head:7817,", "head:7817,spare", ",head:7817", "a:1,unix:"])
def test_a_bad_address_in_the_list_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="unix:PATH or HOST:PORT"):
        check_setting("agent", "coordinator", value, "command line", "--coordinator")


def test_at_most_sixteen_addresses() -> None:
    many = ",".join(f"h{i}:1" for i in range(17))
    with pytest.raises(ConfigError, match="at most 16"):
        check_setting("agent", "coordinator", many, "command line", "--coordinator")
