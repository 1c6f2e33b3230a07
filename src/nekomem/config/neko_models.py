"""The model settings a N.E.K.O. user made in N.E.K.O., as nekomem's model tiers.

N.E.K.O. users pick their model in N.E.K.O.'s API settings page, which it saves in
``<data dir>/config/core_config.json``; the provider table (each provider's base URL and
its model per task) ships with the install, in ``<install>/config/api_providers.json``.
Its memory server asks its ConfigManager for three tiers, the same three nekomem has:
``summary``, ``correction`` and ``emotion`` (``get_model_api_config(tier)``). This module
answers that question the way the reference does (read from
``utils/config_manager/core_config.py``: ``get_core_config`` and ``get_model_api_config``):

- the *assist* provider is ``assistApi`` (when unset: ``free`` if ``coreApi`` is ``free``,
  else ``qwen``); its profile gives the base URL (``openrouter_url``) and the tier's model
  (``summary_model`` / ``correction_model`` / ``emotion_model``);
- its key is the provider's own key field (``api_key_registry[provider].config_field``,
  e.g. ``assistApiKeyQwen``), else ``coreApiKey`` (never the ``free-access`` placeholder);
  the free provider's key is its profile's ``openrouter_api_key``;
- with ``enableCustomApi`` on, a tier whose own slot is complete (``<tier>ModelUrl`` and
  ``<tier>ModelId``) uses the slot: ``<tier>ModelProvider`` ``custom`` (or unset) takes the
  slot's own ``<tier>ModelApiKey``; ``follow_assist`` the assist key; ``follow_core``
  ``coreApiKey``; a named provider that provider's key. Anything incomplete falls back to
  the assist provider, as the reference does.

Not followed: the free route's region rewrite (``lanlan.tech`` → ``lanlan.app`` outside
mainland China, decided by an IP lookup nekomem does not make) and saved per-provider URL
variants (``resolvedProviderUrls``). A tier that cannot be resolved (no providers file, an
unknown provider) is left unset and named in :attr:`NekoModels.missing`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec

from nekomem.config.llm import TIERS
from nekomem.config.neko_data import read_json_object

log = logging.getLogger("nekomem.config")

PROVIDERS_FILE = Path("config") / "api_providers.json"
CORE_CONFIG_FILE = Path("config") / "core_config.json"
FREE_KEY = "free-access"
_FOLLOWS = ("follow_assist", "follow_core")


class TierModel(msgspec.Struct, frozen=True):
    """One tier as N.E.K.O. would call it (the key is a secret: never log it)."""

    base_url: str
    model: str
    api_key: str

    def __repr__(self) -> str:  # keep the key out of any accidental log line
        return f"TierModel(base_url={self.base_url!r}, model={self.model!r}, api_key=<{'set' if self.api_key else 'empty'}>)"


class NekoModels(msgspec.Struct, frozen=True):
    """What was found: the tiers, where each came from, and the tiers left unresolved."""

    tiers: dict[str, TierModel]
    origin: dict[str, str]  # tier -> "assist provider qwen" / "custom API slot"
    missing: dict[str, str]  # tier -> why it was not taken

    def describe(self) -> str:
        """One line for the banner: what was taken (never a key)."""
        if not self.tiers:
            return "no model (" + "; ".join(sorted(set(self.missing.values()))) + ")" if self.missing else "no model"
        parts = [f"{tier}: {m.model} ({self.origin[tier]}{', key set' if m.api_key else ', no key'})" for tier, m in self.tiers.items()]
        return "; ".join(parts)

    def overrides(self) -> dict[str, str]:
        """The ``llm_<tier>_*`` setting values for the resolved tiers."""
        found: dict[str, str] = {}
        for tier, m in self.tiers.items():
            found[f"llm_{tier}_base_url"] = m.base_url
            found[f"llm_{tier}_model"] = m.model
            found[f"llm_{tier}_api_key"] = m.api_key
        return found


def _read_object(path: Path) -> dict[str, Any] | None:
    return read_json_object(path)


def _text(mapping: dict[str, Any], key: str) -> str:
    value = mapping.get(key)
    return value.strip() if isinstance(value, str) else ""


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def resolve(data_dir: Path, install_dir: Path | None) -> NekoModels:
    """The summary, correction and emotion tiers of the N.E.K.O. install at ``install_dir``
    whose data directory is ``data_dir`` (see the module docstring for the rules).
    Never raises for a missing or unreadable file: the tier lands in ``missing``."""
    core = _read_object(data_dir / CORE_CONFIG_FILE)
    if core is None:
        return NekoModels({}, {}, {t: f"no {CORE_CONFIG_FILE.as_posix()} in {data_dir}" for t in TIERS})
    table = _read_object(install_dir / PROVIDERS_FILE) if install_dir is not None else None
    assist_profiles = table.get("assist_api_providers") if table is not None else None
    registry = table.get("api_key_registry") if table is not None else None
    profiles: dict[str, Any] = assist_profiles if isinstance(assist_profiles, dict) else {}
    key_fields: dict[str, Any] = registry if isinstance(registry, dict) else {}

    core_api = _text(core, "coreApi") or "qwen"
    assist = _text(core, "assistApi") or ("free" if core_api == "free" else "qwen")
    core_key = _text(core, "coreApiKey")
    core_key = "" if core_key == FREE_KEY else core_key

    def book_key(provider: str) -> str:
        entry = key_fields.get(provider)
        field = entry.get("config_field") if isinstance(entry, dict) else None
        own = _text(core, field) if isinstance(field, str) else ""
        if own:
            return own
        profile = profiles.get(provider)
        if isinstance(profile, dict) and _text(profile, "openrouter_api_key"):
            return _text(profile, "openrouter_api_key")  # the free route's placeholder key
        return core_key if provider in (core_api, assist) else ""

    tiers: dict[str, TierModel] = {}
    origin: dict[str, str] = {}
    missing: dict[str, str] = {}
    custom_on = _truthy(core.get("enableCustomApi", False))
    assist_profile = profiles.get(assist)
    for tier in TIERS:
        if custom_on:
            url, model = _text(core, f"{tier}ModelUrl"), _text(core, f"{tier}ModelId")
            provider = _text(core, f"{tier}ModelProvider")
            if provider == "follow_assist" and isinstance(assist_profile, dict):
                url = url or _text(assist_profile, "openrouter_url")
            if url and model:
                if provider in ("", "custom"):
                    key = _text(core, f"{tier}ModelApiKey")
                elif provider == "follow_core":
                    key = core_key
                elif provider == "follow_assist":
                    key = book_key(assist)
                else:
                    key = book_key(provider)
                tiers[tier] = TierModel(url, model, key)
                origin[tier] = "custom API slot" + (f", {provider}" if provider else "")
                continue
        if not isinstance(assist_profile, dict):
            where = install_dir / PROVIDERS_FILE if install_dir is not None else "the install's config/api_providers.json"
            missing[tier] = f"assist provider {assist!r} not found in {where}"
            continue
        url, model = _text(assist_profile, "openrouter_url"), _text(assist_profile, f"{tier}_model")
        if not url or not model:
            missing[tier] = f"assist provider {assist!r} names no {tier} model"
            continue
        tiers[tier] = TierModel(url, model, book_key(assist))
        origin[tier] = f"assist provider {assist}"
    return NekoModels(tiers, origin, missing)
