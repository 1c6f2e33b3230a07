"""Stand-in of the reference's ``config`` facade: the ports (``NEKO_*_PORT`` environment
variables, else N.E.K.O.'s defaults) and the instance id, re-read on reload."""

import os

APP_NAME = "N.E.K.O"
MAIN_SERVER_PORT = int(os.environ.get("NEKO_MAIN_SERVER_PORT", "48911"))
MEMORY_SERVER_PORT = int(os.environ.get("NEKO_MEMORY_SERVER_PORT", "48912"))
TOOL_SERVER_PORT = int(os.environ.get("NEKO_TOOL_SERVER_PORT", "48915"))
USER_PLUGIN_SERVER_PORT = int(os.environ.get("NEKO_USER_PLUGIN_SERVER_PORT", "48916"))
INSTANCE_ID = os.environ.get("NEKO_INSTANCE_ID", "")
