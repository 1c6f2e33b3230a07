"""The complete settings tree and its loader.

Precedence, lowest first: built-in defaults, the TOML file (``--config`` or
``NEKOMEM_CONFIG``), environment variables ``NEKOMEM_<FIELD>``, then command-line flags.
The TOML file may be flat (``port = 1``) or sectioned (``[server] port = 1``).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import msgspec

from nekomem.config import neko_data
from nekomem.config.cluster import ClusterSettings
from nekomem.config.embeddings import EMBEDDING_MODELS, EmbeddingSettings, profile_settings
from nekomem.config.importer import ImportSettings
from nekomem.config.llm import LLMSettings
from nekomem.config.longterm import LongTermSettings
from nekomem.config.recall import RecallSettings
from nekomem.config.recent import RecentSettings
from nekomem.config.server import RuntimeSettings, ServerSettings
from nekomem.config.zones import display_zone

ENV_PREFIX = "NEKOMEM_"
# NEKOMEM_* variables that are not settings: the TOML file's path, the server the client
# commands (status, mcp, the Python client) talk to, and the serve command `nekomem neko`
# hands its boot file inside N.E.K.O.'s launcher (neko_boot.SERVE_ENV: inherited by the
# memory server it starts).
OTHER_VARIABLES = frozenset({ENV_PREFIX + "CONFIG", ENV_PREFIX + "URL", ENV_PREFIX + "NEKO_SERVE"})
# ... and the node addresses deploy/haproxy.cfg reads (NEKOMEM_NODE1..3), which a shell
# that starts HAProxy and the nodes may well have exported for both.
OTHER_PATTERN = re.compile(ENV_PREFIX + r"NODE\d+")


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    runtime: RuntimeSettings = msgspec.field(default_factory=RuntimeSettings)
    llm: LLMSettings = msgspec.field(default_factory=LLMSettings)
    recent: RecentSettings = msgspec.field(default_factory=RecentSettings)
    longterm: LongTermSettings = msgspec.field(default_factory=LongTermSettings)
    recall: RecallSettings = msgspec.field(default_factory=RecallSettings)
    embeddings: EmbeddingSettings = msgspec.field(default_factory=EmbeddingSettings)
    importer: ImportSettings = msgspec.field(default_factory=ImportSettings)
    cluster: ClusterSettings = msgspec.field(default_factory=ClusterSettings)
    # The sections of the layers declared with settings of their own (a layer's
    # ``LayerSpec.settings``), as (layer, section) pairs: the caller of load_settings hands
    # their types down (config sits below the layers); a layer reads its own with section().
    layers: tuple[tuple[str, Any], ...] = ()

    def section(self, layer: str, cls: type[S]) -> S:
        """The settings section of ``layer``: as loaded, or its defaults when these settings
        were loaded without it. Raises TypeError when the loaded section is no ``cls``."""
        for name, section in self.layers:
            if name == layer:
                if not isinstance(section, cls):
                    raise TypeError(f"the settings of layer {layer} are a {type(section).__name__}, not a {cls.__name__}")
                return section
        return cls()


S = TypeVar("S", bound=msgspec.Struct)
Sections = Mapping[str, type[msgspec.Struct]]


class SettingsError(ValueError):
    """A setting has an invalid value; the message names the setting."""


def _sections(layers: Sections | None = None) -> dict[str, type[msgspec.Struct]]:
    """The settings sections: the built-in ones, then those of ``layers`` (layer -> its
    section's type)."""
    builtin = {f.name: f.type for f in msgspec.structs.fields(Settings) if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)}
    for name in layers or {}:
        if name in builtin:
            raise RuntimeError(f"settings section {name!r} is defined twice")
    return {**builtin, **(layers or {})}


def field_index(layers: Sections | None = None) -> dict[str, tuple[str, msgspec.structs.FieldInfo, Any]]:
    """Map every field name to (section name, field info, annotated type); ``layers``: the
    sections of declared layers to include."""
    index: dict[str, tuple[str, msgspec.structs.FieldInfo, Any]] = {}
    for section, cls in _sections(layers).items():
        hints = get_type_hints(cls, include_extras=True)
        for info in msgspec.structs.fields(cls):
            if info.name in index:
                raise RuntimeError(f"setting {info.name!r} is defined twice")
            index[info.name] = (section, info, hints[info.name])
    return index


def describe(annotated: Any) -> str:
    for extra in getattr(annotated, "__metadata__", ()):
        if isinstance(extra, msgspec.Meta) and extra.description:
            return extra.description
    return ""


def _base_type(annotated: Any) -> Any:
    if get_origin(annotated) is not None and getattr(annotated, "__metadata__", None):
        return get_args(annotated)[0]
    return annotated


def _coerce_env(name: str, raw: str, annotated: Any) -> Any:
    base = _base_type(annotated)
    if base is str:
        return raw
    if base is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"setting {name} (from {ENV_PREFIX}{name.upper()}): expected a boolean, got {raw!r}")
    try:
        return msgspec.json.decode(raw.strip().encode())
    except msgspec.DecodeError:
        raise SettingsError(f"setting {name} (from {ENV_PREFIX}{name.upper()}): cannot parse {raw!r}") from None


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    layers: Sections | None = None,
) -> Settings:
    """Build the settings from defaults, a TOML file, the environment and overrides.

    ``overrides`` maps field names (e.g. ``"port"``) to values and wins over everything.
    ``layers`` maps a declared layer to the type of its own settings section
    (``nekomem.domain.layers.layer_settings()``), read like the built-in ones
    (``[layer]`` in the file, ``NEKOMEM_<FIELD>``). Raises SettingsError naming the
    setting when a value is unknown or invalid.
    """
    env = os.environ if env is None else env
    index = field_index(layers)
    tree: dict[str, dict[str, Any]] = {name: {} for name in _sections(layers)}

    path = config_path or env.get(ENV_PREFIX + "CONFIG") or None
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in raw.items():
            if key in tree and isinstance(value, dict):
                for sub, subvalue in value.items():
                    if sub not in index or index[sub][0] != key:
                        raise SettingsError(f"unknown setting {key}.{sub} in {path}")
                    tree[key][sub] = subvalue
            elif key in index:
                tree[index[key][0]][key] = value
            else:
                raise SettingsError(f"unknown setting {key} in {path}")

    _refuse_unknown_variables(env, index)
    for name, (section, _info, annotated) in index.items():
        env_name = ENV_PREFIX + name.upper()
        if env_name in env:
            tree[section][name] = _coerce_env(name, env[env_name], annotated)

    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in index:
            raise SettingsError(f"unknown setting {name}")
        tree[index[name][0]][name] = value

    _fill_from_neko_data_dir(tree, index, env)
    _fill_from_model_profile(tree, index)
    own = {name: tree.pop(name) for name in layers or {}}
    settings = _convert(tree, Settings, index)
    if layers:
        sections = tuple((name, _convert(own[name], cls, index)) for name, cls in layers.items())
        settings = msgspec.structs.replace(settings, layers=sections)
    try:
        display_zone(settings.server.display_timezone)
    except ValueError as exc:
        raise SettingsError(f"invalid setting display_timezone: {exc}") from None
    return settings


def _convert(tree: Mapping[str, Any], cls: type[S], index: Mapping[str, object]) -> S:
    """``tree`` as a ``cls``. Raises SettingsError naming the setting msgspec refused."""
    try:
        return msgspec.convert(tree, cls, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec names the path as `$.section.field`; keep just the field.
        message = str(exc)
        for name in index:
            if f".{name}`" in message or f".{name}" in message.split("`")[-2:-1]:
                raise SettingsError(f"invalid setting {name}: {message}") from None
        raise SettingsError(f"invalid settings: {message}") from None


def _refuse_unknown_variables(env: Mapping[str, str], index: Mapping[str, object]) -> None:
    """Raise SettingsError for a ``NEKOMEM_*`` variable that names no setting, as for an
    unknown TOML key: a mistyped (``NEKOMEM_PROT``) or removed setting would otherwise be
    ignored without a word, and the server run with a default the user meant to change."""
    known = {ENV_PREFIX + name.upper() for name in index} | OTHER_VARIABLES
    unknown = sorted(key for key in env if key.upper().startswith(ENV_PREFIX) and key not in known and not OTHER_PATTERN.fullmatch(key))
    if not unknown:
        return
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key.upper(), known, n=1, cutoff=0.75)
        parts.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise SettingsError(
        f"unknown environment variable{'s' if len(parts) > 1 else ''} {', '.join(parts)}: "
        "nekomem reads NEKOMEM_<SETTING> for each setting (`nekomem settings` lists them); unset or rename it"
    )


def _fill_from_neko_data_dir(
    tree: dict[str, dict[str, Any]], index: dict[str, tuple[str, msgspec.structs.FieldInfo, Any]], env: Mapping[str, str]
) -> None:
    """Settings the user did not set come from the N.E.K.O. data directory, when one is named."""
    value = tree["server"].get("neko_data_dir", "")
    if not isinstance(value, str):
        return  # reported by the conversion
    data_dir = neko_data.resolve(value, env)
    if data_dir is None:
        return
    tree["server"]["neko_data_dir"] = str(data_dir)
    for name, found in neko_data.defaults(data_dir, env).items():
        tree[index[name][0]].setdefault(name, found)


def _fill_from_model_profile(tree: dict[str, dict[str, Any]], index: dict[str, tuple[str, msgspec.structs.FieldInfo, Any]]) -> None:
    """Cosine thresholds the user did not set come from the embedding model's profile.json."""
    chosen, defaults = tree["embeddings"], EmbeddingSettings()
    model = chosen.get("embedding_model", defaults.embedding_model)
    model_dir = chosen.get("embedding_model_dir", defaults.embedding_model_dir)
    if not isinstance(model, str) or not isinstance(model_dir, str) or (not model_dir and model not in EMBEDDING_MODELS):
        return  # invalid values are reported by the conversion below
    for name, value in profile_settings(model, model_dir).items():
        tree[index[name][0]].setdefault(name, value)


def settings_markdown(layers: Sections | None = None) -> str:
    """Every setting as Markdown: one ``### [section]`` heading and table per settings section
    (its TOML key, environment variable, default and meaning); docs/CONFIGURATION.md holds it.
    ``layers``: the sections of declared layers to include."""
    defaults = Settings(layers=tuple((name, cls()) for name, cls in (layers or {}).items()))
    index = field_index(layers)
    blocks: list[str] = []
    for section in _sections(layers):
        lines = [f"### `[{section}]`", "", "| setting | environment variable | default | meaning |", "|---|---|---|---|"]
        for name, (owner, _info, annotated) in index.items():
            if owner != section:
                continue
            values = getattr(defaults, section) if section not in (layers or {}) else dict(defaults.layers)[section]
            value = getattr(values, name)
            shown = "(empty)" if value == "" else repr(value) if isinstance(value, str) else str(value)
            lines.append(f"| `{name}` | `{ENV_PREFIX}{name.upper()}` | `{shown}` | {describe(annotated)} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
