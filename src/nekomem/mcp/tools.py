"""The MCP tools and resources, implemented once over :class:`AsyncNekomemClient`.

Tools: ``recall_memory`` (query, time), ``remember`` (a fact through the facts import
route, so dedup applies), ``get_context`` (the ``/new_dialog`` text), ``confirm_memory`` /
``deny_memory`` (reflection feedback). Resources: the persona and the recent window.

:func:`build_server` registers them for one fixed character (stdio: the tools take no
``character`` argument, the resources are ``nekomem://characters/<name>/persona`` and
``.../recent``) or for any character (the HTTP mount: every tool takes ``character`` and
the resources are URI templates).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar
from urllib.parse import quote

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import Field

from nekomem import __version__
from nekomem.client import AsyncNekomemClient, FactImport, NekomemError

T = TypeVar("T")

Query = Annotated[str, Field(description="What to look for (words of the memory); may be empty when a time is given.")]
Time = Annotated[
    str,
    Field(description='A time or period: ISO ("2026-05-01", "2026-05") or natural ("yesterday", "last week", "in March"); may be empty.'),
]
Text = Annotated[str, Field(description="One self-contained fact, e.g. 'Master is allergic to cats'.")]
Importance = Annotated[int, Field(ge=1, le=10, description="How much the fact matters, 1 to 10.")]
ReflectionId = Annotated[str, Field(description="The id of a reflection (ref_...), as listed by recall_memory.")]
Character = Annotated[str, Field(description="The character whose memory is used (a folder name on the server).")]

INSTRUCTIONS = (
    "Long-term memory of an AI companion character, served by nekomem. Call get_context at the start of a "
    "conversation, recall_memory to look something up, remember to keep a new fact, and confirm_memory / "
    "deny_memory when the user confirms or denies one of the character's impressions (reflections)."
)


async def _call(what: Awaitable[T], error: type[Exception] = ToolError) -> T:
    """Await a client call; the server's refusal or an unreachable server becomes ``error``
    (a message for the model, never a crash of the MCP session)."""
    try:
        return await what
    except NekomemError as exc:
        if exc.status == 0:
            raise error(f"nekomem could not be reached: {exc.error_code}") from None
        raise error(f"nekomem refused the request: {exc.status} {exc.error_code}: {exc.message}") from None


class MemoryTools:
    """The tool and resource bodies, each for a given character."""

    def __init__(self, client: AsyncNekomemClient) -> None:
        self.client = client

    async def recall_memory(self, character: str, query: str = "", time: str = "") -> str:
        """The recall block for the model, then the ids of the reflections in it (for
        confirm_memory / deny_memory). Raises ToolError when nekomem refuses."""
        answer = await _call(self.client.recall(character, query or None, time or None, markdown=True))
        text = answer.markdown or ""
        reflections = [r for r in answer.results if r.tier == "reflection"]
        if reflections:
            text += "\n\nReflection ids (for confirm_memory / deny_memory):\n"
            text += "\n".join(f"- {r.id}: {r.text}" for r in reflections)
        return text

    async def remember(self, character: str, text: str, importance: int = 5) -> str:
        """Add one fact through the facts import route (a duplicate of a stored fact is
        skipped). Raises ToolError when nekomem refuses (e.g. an empty text)."""
        answer = await _call(self.client.add_facts(character, [FactImport(text=text, importance=importance)]))
        if answer.added:
            return f"Remembered (fact id {answer.added[0]})."
        return "Already known: an equivalent fact is stored, nothing was added."

    async def get_context(self, character: str) -> str:
        """The working context of ``/new_dialog`` (persona, impressions, recent window)."""
        text = await _call(self.client.new_dialog(character))
        return text or "No memory of this character yet."

    async def feedback(self, character: str, reflection_id: str, confirmed: bool) -> str:
        """Confirm or deny a reflection. Raises ToolError for an unknown id."""
        value: Literal["confirmed", "denied"] = "confirmed" if confirmed else "denied"
        answer = await _call(self.client.feedback(character, reflection_id, value))
        return f"Reflection {reflection_id} {value}; its status is now {answer.get('status', 'unknown')}."

    async def persona(self, character: str) -> str:
        """The persona entries, one ``[entity] text`` line each. Raises ResourceError."""
        page = await _call(self.client.persona(character), ResourceError)
        return "\n".join(f"[{item.get('entity', '')}] {item.get('text', '')}" for item in page.items)

    async def recent(self, character: str) -> str:
        """The recent window, one ``speaker | text`` line per item. Raises ResourceError."""
        return await _call(self.client.recent_history(character), ResourceError)


def build_server(client: AsyncNekomemClient, character: str | None = None) -> MCPServer:
    """An MCP server whose tools and resources use ``client``: for ``character`` only, or,
    with None, for the character each call names."""
    server = MCPServer("nekomem", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    tools = MemoryTools(client)
    if character is None:
        _register_any(server, tools)
    else:
        _register_one(server, tools, character)
    return server


def _register_one(server: MCPServer, tools: MemoryTools, name: str) -> None:
    """Tools without a ``character`` argument and static resources, for ``name``."""

    @server.tool(description="Search the character's long-term memory by words and/or time.")
    async def recall_memory(query: Query = "", time: Time = "") -> str:
        return await tools.recall_memory(name, query, time)

    @server.tool(description="Remember a new fact (skipped when an equivalent fact is already known).")
    async def remember(text: Text, importance: Importance = 5) -> str:
        return await tools.remember(name, text, importance)

    @server.tool(description="The character's working context: persona, impressions and the recent conversation.")
    async def get_context() -> str:
        return await tools.get_context(name)

    @server.tool(description="The user confirmed one of the character's impressions (a reflection).")
    async def confirm_memory(reflection_id: ReflectionId) -> str:
        return await tools.feedback(name, reflection_id, True)

    @server.tool(description="The user denied one of the character's impressions (a reflection).")
    async def deny_memory(reflection_id: ReflectionId) -> str:
        return await tools.feedback(name, reflection_id, False)

    base = f"nekomem://characters/{quote(name, safe='')}"
    _resource(server, f"{base}/persona", "persona", "What the character knows for good.", lambda: tools.persona(name))
    _resource(server, f"{base}/recent", "recent", "The recent conversation window.", lambda: tools.recent(name))


def _resource(server: MCPServer, uri: str, name: str, description: str, read: Callable[[], Awaitable[str]]) -> None:
    @server.resource(uri, name=name, description=description, mime_type="text/plain")
    async def resource() -> str:
        return await read()


def _register_any(server: MCPServer, tools: MemoryTools) -> None:
    """Tools taking a ``character`` argument and URI-template resources."""

    @server.tool(description="Search a character's long-term memory by words and/or time.")
    async def recall_memory(character: Character, query: Query = "", time: Time = "") -> str:
        return await tools.recall_memory(character, query, time)

    @server.tool(description="Remember a new fact for a character (skipped when an equivalent fact is already known).")
    async def remember(character: Character, text: Text, importance: Importance = 5) -> str:
        return await tools.remember(character, text, importance)

    @server.tool(description="A character's working context: persona, impressions and the recent conversation.")
    async def get_context(character: Character) -> str:
        return await tools.get_context(character)

    @server.tool(description="The user confirmed one of the character's impressions (a reflection).")
    async def confirm_memory(character: Character, reflection_id: ReflectionId) -> str:
        return await tools.feedback(character, reflection_id, True)

    @server.tool(description="The user denied one of the character's impressions (a reflection).")
    async def deny_memory(character: Character, reflection_id: ReflectionId) -> str:
        return await tools.feedback(character, reflection_id, False)

    @server.resource("nekomem://characters/{character}/persona", name="persona", mime_type="text/plain")
    async def persona(character: str) -> str:
        return await tools.persona(character)

    @server.resource("nekomem://characters/{character}/recent", name="recent", mime_type="text/plain")
    async def recent(character: str) -> str:
        return await tools.recent(character)
