"""Where ferryctl finds its server and token (no server needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferryctl.config import Config, ConfigError, config_load, config_path, config_save


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("FERRY_URL", raising=False)
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    return tmp_path


def test_the_environment_wins_over_the_file_field_by_field(home, monkeypatch):
    config_save(Config(url="https://file.example", token="file-token"))
    assert config_load() == Config(url="https://file.example", token="file-token")
    monkeypatch.setenv("FERRY_TOKEN", "env-token")
    assert config_load() == Config(url="https://file.example", token="env-token")


def test_the_saved_file_is_private_even_if_it_existed(home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("url = 'x'\n")
    path.chmod(0o644)
    config_save(Config(url="https://a.example", token="t"))
    assert path.stat().st_mode & 0o777 == 0o600


def test_missing_or_broken_config_says_how_to_fix_it(home, monkeypatch):
    with pytest.raises(ConfigError, match="FERRY_URL"):
        config_load()
    monkeypatch.setenv("FERRY_URL", "ftp://x")
    with pytest.raises(ConfigError, match="http://"):
        config_load()
    monkeypatch.delenv("FERRY_URL")
    config_path().parent.mkdir(parents=True)
    config_path().write_text("url = [unclosed")
    with pytest.raises(ConfigError, match="login"):
        config_load()


@given(token=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=80))
def test_any_token_round_trips_through_the_file(tmp_path_factory, token):
    saved = Config(url="https://ferry.example", token=token)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("cfg")))
        patch.delenv("FERRY_URL", raising=False)
        patch.delenv("FERRY_TOKEN", raising=False)
        config_save(saved)
        assert config_load() == saved
