"""Settings: every tunable of nekomem, with its documented default."""

from nekomem.config.settings import Settings, SettingsError, load_settings, settings_markdown

__all__ = ["Settings", "SettingsError", "load_settings", "settings_markdown"]
