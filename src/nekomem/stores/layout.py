"""Where things live under the memory root, and which character names are allowed.

``<memory_root>/<character>/`` holds every file of one character; the root itself holds
only character folders plus ``core_config.json`` (process-wide switches such as powerful
memory). A character name becomes a folder name, so :func:`validate_name` is the only gate
between a URL segment and the file system.

A *N.E.K.O. memory folder* (the reference's own ``<data dir>/memory/``, marked by
:data:`NEKO_FOLDER_MARKER` at its root, see :mod:`nekomem.importer.neko_folder`) is laid
out for two readers: ``<character>/`` keeps the reference's files in the reference's
formats, and nekomem's own files of that character live in ``<character>/.nekomem/``, so a
rename or delete of the character folder by N.E.K.O.'s main process carries them along.
``recent.json`` is the one file both share (``<character>/recent.json``).

Name rules (SPEC §2, plus the portability decisions documented on :func:`validate_name`).
"""

from __future__ import annotations

import functools
import logging
import os
import unicodedata
from collections.abc import Collection
from pathlib import Path

from nekomem.domain.layers import character_files
from nekomem.stores.atomic import atomic_write_json, fsync_dir
from nekomem.stores.private import private_folder

log = logging.getLogger(__name__)

# Mirror the defaults of ServerSettings.name_max_length / name_max_units; callers pass the settings.
DEFAULT_NAME_MAX_LENGTH = 50
DEFAULT_NAME_MAX_UNITS = 60

CORE_CONFIG_FILE = "core_config.json"
# At the root of a N.E.K.O. memory folder: nekomem's files of a character live in its
# STATE_DIR (written by importer.neko_folder.adopt, read here).
NEKO_FOLDER_MARKER = ".nekomem-neko-folder.json"
STATE_DIR = ".nekomem"
# At the root: the process-wide public knowledge packs (stores.knowledge.KNOWLEDGE_DIR).
KNOWLEDGE_DIR = ".nekomem-knowledge"
# In a character's STATE_DIR once the reference's files of that folder were imported (or
# when nekomem made the folder: nothing to import).
ADOPTED_FILE = "adopted.json"
# In a character's STATE_DIR: the identity of each reference file as nekomem last wrote or saw it.
MIRROR_FILE = "mirror.json"
# The reference's files that make a folder one of its characters (importer.neko_source).
_REFERENCE_CHARACTER_FILES = ("recent.json", "time_indexed.db", "facts.json", "reflections.json", "persona.json")

# Windows device names are reserved in every folder and with any extension ("nul.txt"). A
# memory root must stay copyable between operating systems, so they are refused everywhere.
# The set is the reference's (utils/character_name.py), CLOCK$ included.
_WINDOWS_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul", "clock$"} | {f"com{i}" for i in range(1, 10)} | {f"lpt{i}" for i in range(1, 10)}
)
# Entries of the root that are not characters: the shared switches file, the root lock, the
# N.E.K.O. folder marker, nekomem's state folder and the public knowledge packs' folder.
_ROOT_RESERVED = frozenset({CORE_CONFIG_FILE.casefold(), ".nekomem.lock", NEKO_FOLDER_MARKER, STATE_DIR, KNOWLEDGE_DIR})
# nekomem's own temp and swap files (stores.atomic) start with this; a character folder of
# that name could be taken for one of them by the stale-temp sweeper.
_TEMP_PREFIX = ".nkatmp"
# The punctuation the reference allows in a character name (SAFE_CHARACTER_NAME_EXTRA_CHARS)
# plus the dot, which it allows in names that already exist (allow_dots=True on requests).
_ALLOWED_PUNCTUATION = frozenset(" _-.()（）·・•'’")
# Never allowed, whatever their category: Windows' forbidden file-name characters.
_FORBIDDEN = frozenset('<>:"/\\|?*')
# Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt): characters a
# renderer shows as nothing. Several are letters or marks by category (the Hangul fillers
# U+115F, U+1160, U+3164, U+FFA0; variation selectors; the combining grapheme joiner), so
# the category rule alone would let two names that look identical name two folders.
_DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def is_default_ignorable(ch: str) -> bool:
    """True for a code point that renders as nothing (Default_Ignorable_Code_Point)."""
    code = ord(ch)
    return any(low <= code <= high for low, high in _DEFAULT_IGNORABLE)


# Files of a character folder (each layer declares its own, see known_entries).
RECENT_FILE = "recent.json"
RECENT_META_FILE = "recent_meta.json"
TIME_INDEX_FILE = "time_indexed.db"
FACTS_FILE = "facts.json"
FACTS_ARCHIVE_FILE = "facts_archive.json"
REFLECTIONS_FILE = "reflections.json"
SURFACED_FILE = "surfaced.json"
REFLECTION_ARCHIVE_DIR = "reflection_archive"
PERSONA_FILE = "persona.json"
PERSONA_CORRECTIONS_FILE = "persona_corrections.json"
PERSONA_ARCHIVE_DIR = "persona_archive"
OUTBOX_FILE = "outbox.ndjson"
EVENTS_FILE = "events.ndjson"
EVENTS_APPLIED_FILE = "events_applied.json"
CURSORS_FILE = "cursors.json"
SELF_DISCLOSURE_FILE = "self_disclosure.json"
STATE_FILE = "state.json"
# The files no single layer owns: the shared event journal and its marks, the cursors and
# the per-character flags.
SHARED_ENTRIES: tuple[str, ...] = (EVENTS_FILE, EVENTS_APPLIED_FILE, CURSORS_FILE, STATE_FILE)
# Derived, rebuilt when missing: the recall index of the facts (recall/segment.py), no text,
# and the facts' cached vectors as one float16 block (layers/recall/persist.py).
RECALL_SEGMENT_FILE = "recall_segment.bin"
RECALL_VECTORS_FILE = "recall_vectors.bin"


def known_entries() -> tuple[str, ...]:
    """The entries of a character folder nekomem knows: every declared layer's files
    (:func:`nekomem.domain.layers.character_files`) and the shared ones; a folder holding
    one of them is a character."""
    return character_files() + SHARED_ENTRIES


class InvalidName(ValueError):
    """A character name breaks the name rules; ``code`` is the machine-readable reason.

    Codes: ``name_empty``, ``name_too_long``, ``name_invalid_chars``, ``name_reserved``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _char_allowed(ch: str, first: bool) -> bool:
    if ch.isascii() and ch.isalnum():
        return True  # the common case, decided without the Unicode tables
    if ch in _FORBIDDEN or is_default_ignorable(ch):
        return False
    category = unicodedata.category(ch)
    if category[0] == "C":
        return False
    # The reference's rule: alphanumerics of any script (str.isalnum: letters and every
    # numeric character), any space separator (Zs), and its listed punctuation.
    if ch in _ALLOWED_PUNCTUATION or ch.isalnum() or category == "Zs":
        return True
    # Combining marks are part of letters in many scripts (Devanagari, Thai, Hebrew
    # points); they cannot start a name because alone they attach to nothing.
    return category[0] == "M" and not first


def name_units(name: str) -> int:
    """The reference's length measure of a name: 1 per ASCII character, 2 per other."""
    return sum(1 if ord(ch) <= 0x7F else 2 for ch in name)


def validate_name(raw: str, max_length: int = DEFAULT_NAME_MAX_LENGTH, max_units: int = DEFAULT_NAME_MAX_UNITS) -> str:
    """Check a character name and return its canonical form (stripped, Unicode NFC).

    Accepted is what the reference chat server accepts on a request
    (``utils/character_name.py``, ``allow_dots=True``): 1..``max_length`` characters and
    at most ``max_units`` units (ASCII 1, any other character 2), counted after strip and
    NFC, made of letters and numbers of any script (``str.isalnum``), any space separator,
    ``_ - ( ) （ ） · ・ • ' ’`` and dots (a legacy ``.Carol`` exists in real installs).
    nekomem also accepts combining marks after the first character (an NFD spelling is the
    same folder as its NFC form). Hence no path separator, no control or invisible
    formatting character, nothing that can leave the memory root. Default-ignorable code
    points (Hangul fillers, zero-width characters, variation selectors, the combining
    grapheme joiner) are refused although some are letters: they render as nothing, so
    they would make look-alike names. Refused as ``name_reserved``:

    - ``.``, any name containing ``..``, and any name ending with a dot (Windows drops a
      trailing dot, so ``neko.`` and ``neko`` would share one folder);
    - Windows device names (``CON``, ``PRN``, ``AUX``, ``NUL``, ``CLOCK$``, ``COM1``-``9``,
      ``LPT1``-``9``, any case, also followed by an extension such as ``nul.txt``), on
      every OS, so that a memory root can be moved between systems;
    - names of the root's own entries (``core_config.json``, ``.nekomem.lock``, the
      knowledge packs' ``.nekomem-knowledge``) and of
      nekomem's temp files (``.nkatmp...``).

    Case is preserved; on a case-insensitive file system ``Neko`` and ``neko`` share one
    folder. Raises :class:`InvalidName`. The message never repeats the name.
    """
    if not isinstance(raw, str):
        raise InvalidName("name_invalid_chars", "the character name must be a string")
    return _checked_name(raw, max_length, max_units)


# Every request to a character's route checks its name, some twice (the release fence, then
# the route): a name already accepted is answered from here (the rules are fixed; a refused
# name raises every time, exceptions are not cached).
@functools.lru_cache(maxsize=4096)
def _checked_name(raw: str, max_length: int, max_units: int) -> str:
    """:func:`validate_name` of a string."""
    # Spaces around a name are dropped (as the reference does), but not a control
    # character there: ``Lan\n`` (``Lan%0A`` in a URL) is refused, not taken for ``Lan``.
    stripped = raw.strip()
    leading, trailing = raw[: len(raw) - len(raw.lstrip())], raw[len(raw.rstrip()) :]
    for ch in leading + trailing:
        if unicodedata.category(ch) != "Zs":
            raise InvalidName(
                "name_invalid_chars",
                f"the character name contains the invisible, control or format character U+{ord(ch):04X}; "
                "allowed are letters, digits, spaces and _ - ( ) （ ） · ・ • ' ’ .",
            )
    name = unicodedata.normalize("NFC", stripped)
    if not name:
        raise InvalidName("name_empty", "the character name is empty")
    if len(name) > max_length:
        raise InvalidName("name_too_long", f"the character name has {len(name)} characters; the limit is {max_length}")
    units = name_units(name)
    if units > max_units:
        raise InvalidName("name_too_long", f"the character name has {units} units (ASCII 1, others 2); the limit is {max_units}")
    for index, ch in enumerate(name):
        if not _char_allowed(ch, index == 0):
            if ch in "/\\":
                problem = "a path separator"
            elif unicodedata.category(ch)[0] == "C" or is_default_ignorable(ch):
                problem = f"the invisible, control or format character U+{ord(ch):04X}"
            else:
                problem = f"the character U+{ord(ch):04X}"
            raise InvalidName(
                "name_invalid_chars",
                f"the character name contains {problem}; allowed are letters, digits, spaces and _ - ( ) （ ） · ・ • ' ’ .",
            )
    if name == "." or ".." in name:
        raise InvalidName("name_reserved", "'.' and names containing '..' are not character names")
    if name.endswith("."):
        raise InvalidName("name_reserved", "a character name cannot end with '.'")
    stem = name.split(".", 1)[0].rstrip(" ").casefold()
    if stem in _WINDOWS_DEVICE_NAMES:
        raise InvalidName("name_reserved", "the character name is a reserved device name (CON, NUL, COM1, ...)")
    folded = name.casefold()
    if folded in _ROOT_RESERVED or folded.startswith(_TEMP_PREFIX):
        raise InvalidName("name_reserved", "the character name is reserved for a file of the memory root")
    return name


@functools.lru_cache(maxsize=64)
def _neko_folder(root: str) -> bool:
    return os.path.isfile(os.path.join(root, NEKO_FOLDER_MARKER))


def is_neko_folder(root: Path) -> bool:
    """Whether ``root`` is a N.E.K.O. memory folder nekomem serves in place (the marker is
    there). Cached per root; :func:`forget_neko_folder` drops the cache after adoption."""
    return _neko_folder(str(root))


def forget_neko_folder() -> None:
    """Drop the cached :func:`is_neko_folder` answers (after a marker was written)."""
    _neko_folder.cache_clear()


def core_config_path(root: Path) -> Path:
    """Path of the root-level ``core_config.json`` (process-wide switches, e.g. powerful memory)."""
    return Path(root) / CORE_CONFIG_FILE


class CharacterPaths:
    """Every path of one character's folder. Creating the object touches nothing on disk.

    The name is validated (raises :class:`InvalidName`) and kept in canonical form in
    ``name``. ``max_length`` / ``max_units`` should be the configured name_max_length / name_max_units. Each path is
    built once, on first use (the write path asks for some on every request).
    """

    def __init__(
        self, root: Path, name: str, *, max_length: int = DEFAULT_NAME_MAX_LENGTH, max_units: int = DEFAULT_NAME_MAX_UNITS
    ) -> None:
        self.root = Path(root)
        self.name = validate_name(name, max_length, max_units)
        # home: the character's folder as N.E.K.O. sees it; folder: where nekomem's own
        # files are (the same folder, except in a N.E.K.O. memory folder).
        self.home = self.root / self.name
        self.neko_folder = is_neko_folder(self.root)
        self.folder = self.home / STATE_DIR if self.neko_folder else self.home

    def __repr__(self) -> str:
        return f"CharacterPaths(root={str(self.root)!r}, name={self.name!r})"

    def ensure(self) -> Path:
        """Create the character folder (and the root) if missing; return the folder.

        A newly created folder is made durable by fsyncing the root. Raises OSError.
        """
        if not self.folder.is_dir():
            private_folder(self.home)
            if self.folder != self.home:
                private_folder(self.folder)
                if not any((self.home / name).exists() for name in _REFERENCE_CHARACTER_FILES):
                    # A character nekomem starts itself has nothing of the reference's to
                    # adopt: marked adopted now, so no later adoption imports its mirror back.
                    atomic_write_json(self.folder / ADOPTED_FILE, {"source": "nekomem"})
                fsync_dir(self.home)
            fsync_dir(self.root)
        return self.folder

    def exists(self) -> bool:
        """True when the folder holds at least one known file (the :func:`list_characters` rule)."""
        return _has_known_entry(os.fspath(self.folder))

    @functools.cached_property
    def recent(self) -> Path:
        """recent.json: in a N.E.K.O. memory folder, the reference's own file (shared)."""
        return self.home / RECENT_FILE

    @functools.cached_property
    def recent_meta(self) -> Path:
        return self.folder / RECENT_META_FILE

    @functools.cached_property
    def time_index_db(self) -> Path:
        return self.folder / TIME_INDEX_FILE

    @functools.cached_property
    def facts(self) -> Path:
        return self.folder / FACTS_FILE

    @functools.cached_property
    def facts_archive(self) -> Path:
        return self.folder / FACTS_ARCHIVE_FILE

    @functools.cached_property
    def recall_segment(self) -> Path:
        """recall_segment.bin: the persisted recall index of the facts (derived; no text)."""
        return self.folder / RECALL_SEGMENT_FILE

    @functools.cached_property
    def recall_vectors(self) -> Path:
        """recall_vectors.bin: the facts' cached vectors beside their segment (derived; no text)."""
        return self.folder / RECALL_VECTORS_FILE

    @functools.cached_property
    def reflections(self) -> Path:
        return self.folder / REFLECTIONS_FILE

    @functools.cached_property
    def surfaced(self) -> Path:
        return self.folder / SURFACED_FILE

    @functools.cached_property
    def reflection_archive_dir(self) -> Path:
        return self.folder / REFLECTION_ARCHIVE_DIR

    @functools.cached_property
    def persona(self) -> Path:
        return self.folder / PERSONA_FILE

    @functools.cached_property
    def persona_corrections(self) -> Path:
        return self.folder / PERSONA_CORRECTIONS_FILE

    @functools.cached_property
    def persona_archive_dir(self) -> Path:
        return self.folder / PERSONA_ARCHIVE_DIR

    @functools.cached_property
    def outbox(self) -> Path:
        return self.folder / OUTBOX_FILE

    @functools.cached_property
    def events(self) -> Path:
        return self.folder / EVENTS_FILE

    @functools.cached_property
    def events_applied(self) -> Path:
        return self.folder / EVENTS_APPLIED_FILE

    @functools.cached_property
    def cursors(self) -> Path:
        return self.folder / CURSORS_FILE

    @functools.cached_property
    def self_disclosure(self) -> Path:
        """``self_disclosure.json``: the path-B cursor (FactActor is its one writer)."""
        return self.folder / SELF_DISCLOSURE_FILE

    @functools.cached_property
    def state(self) -> Path:
        """``state.json``: small per-character flags."""
        return self.folder / STATE_FILE


def _has_known_entry(folder: str) -> bool:
    # String paths, not pathlib: a start-up listing asks this of every folder of the root.
    exists, join = os.path.exists, os.path.join
    return any(exists(join(folder, entry)) for entry in known_entries())


def _listed_folder(root: str, name: str, neko: bool) -> str:
    """The listing rule looks for a known file of nekomem's in a folder; this is where (in a
    N.E.K.O. memory folder: in its state folder; the reference's files alone make no
    character of nekomem's until adopted)."""
    return os.path.join(root, name, STATE_DIR) if neko else os.path.join(root, name)


def list_characters(root: Path, *, max_length: int = DEFAULT_NAME_MAX_LENGTH, settled: Collection[str] = ()) -> list[str]:
    """Names of the character folders under ``root``, sorted.

    A folder counts when its name is valid, its canonical form names the same folder
    (an NFD folder name on a normalising file system lists in NFC), and it holds at least
    one known file. A folder named in ``settled`` (the names of an earlier listing of this
    root) counts while it is there, unchecked: so a repeated listing costs a directory
    read, not a look into every folder. A missing root lists nothing; other OSErrors
    propagate.
    """
    return scan_characters(root, max_length=max_length, settled=settled)[0]


def scan_characters(root: Path, *, max_length: int = DEFAULT_NAME_MAX_LENGTH, settled: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """:func:`list_characters`, and beside it the folders with a valid name that are not
    characters (yet): a file written into one later makes it a character without
    changing the root folder's modification time. Raises as :func:`list_characters`."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return [], []
    names: set[str] = set()
    undecided: list[str] = []
    base, neko = os.fspath(root), is_neko_folder(root)
    for entry in entries:
        if entry.name in settled and entry.is_dir():
            names.add(entry.name)
            continue
        if not entry.is_dir():
            continue
        try:
            name = validate_name(entry.name, max_length)
        except InvalidName:
            log.debug("skipping folder with an invalid character name under %s", root)
            continue
        if name != entry.name and not os.path.isdir(os.path.join(base, name)):
            log.warning("skipping a character folder whose name is not in canonical (NFC) form")
            continue
        if _has_known_entry(_listed_folder(base, name, neko)):
            names.add(name)
        else:
            undecided.append(name)
    return sorted(names), undecided
