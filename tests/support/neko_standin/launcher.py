"""The stand-in's ``launcher.py``: a thin facade over ``launcher_core.runtime`` (as the
reference's launcher became)."""

import sys

from launcher_core.runtime import start_launcher

if __name__ == "__main__":
    sys.exit(start_launcher())
