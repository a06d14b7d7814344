"""The optional TOML config file, a pydantic-settings source below flags and the environment.

`--config PATH` or $GPT_OSS_CONFIG names it; its keys are the settings' names (`n_ctx = 65536`,
`n-ctx` works too). Precedence: flags > GPT_OSS_* environment > config file > defaults. The file
is read after the flags and the environment have been collected, so either may name it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from server.contracts.errors import ConfigFileError

CONFIG_FIELD = "config"


class ConfigFileSource(PydanticBaseSettingsSource):
    """Values from the TOML file named by the `config` setting of a higher-priority source."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get(CONFIG_FIELD)
        if not path:
            return {}
        return read_config_file(Path(path), self.settings_cls.model_fields)


def read_config_file(path: Path, fields: Collection[str]) -> dict[str, Any]:
    """The settings in a TOML file; ConfigFileError names what is wrong with it."""
    try:
        data = tomllib.loads(path.expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"the config file {path} is not valid TOML: {exc}") from exc
    values = {key.replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(key for key in values if key not in fields or key == CONFIG_FIELD)
    if unknown:
        raise ConfigFileError(
            f"the config file {path} has unknown settings: {', '.join(unknown)}. Its keys are "
            "the names of `gpt-oss-server serve --help`'s options, e.g. n_ctx = 65536."
        )
    return values
