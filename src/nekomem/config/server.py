"""Server, storage and runtime settings."""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc


class ServerSettings(Section, frozen=True):
    host: Annotated[str, doc("Address the HTTP server binds to.")] = "127.0.0.1"
    port: Annotated[int, doc("TCP port of the HTTP server.", ge=0, le=65535)] = 48912
    api_token: Annotated[
        str, doc("Bearer token every route but /health requires when set. Binding to anything but loopback refuses to start without it.")
    ] = ""
    allowed_hosts: Annotated[
        list[str],
        doc(
            "Host names served besides loopback names and the bind host (requests addressed to any other Host get 403, against DNS rebinding)."
        ),
    ] = []
    allowed_origins: Annotated[
        list[str],
        doc(
            "Web origins (scheme://host:port) whose pages may call the server; a request with any other Origin gets 403. The server's own origin is always allowed."
        ),
    ] = []
    mcp_enabled: Annotated[
        bool,
        doc("Serve the MCP streamable-HTTP endpoint at /mcp (behind the same guard and token) when the optional mcp package is installed."),
    ] = True
    memory_root: Annotated[str, doc("Folder that holds one sub-folder per character.")] = "./memory"
    log_level: Annotated[str, doc("Log level: DEBUG, INFO, WARNING or ERROR. Memory text is only logged at DEBUG.")] = "INFO"
    max_body_bytes: Annotated[int, doc("Largest accepted request body in bytes; larger bodies get 413.", ge=1024)] = 8 * 1024 * 1024
    ask_timeout_seconds: Annotated[float, doc("How long a request waits for its character's actor before answering 503.", gt=0)] = 30.0
    settle_timeout_seconds: Annotated[
        float, doc("How long /process, /renew, /settle and /new_dialog wait for an in-flight compression before answering.", gt=0)
    ] = 120.0
    storage_retry_after_seconds: Annotated[
        int, doc("Retry-After (seconds) of a 507/503 answer caused by a full, read-only or failing disk.", ge=1)
    ] = 10
    limited_retry_after_seconds: Annotated[
        int,
        doc(
            "Retry-After (seconds) of a 409 storage_startup_blocked answer (start-up recovery, or limited mode set by the chat server); the Python client waits that long before it asks again.",
            ge=1,
        ),
    ] = 1
    idempotency_ttl_seconds: Annotated[float, doc("How long an Idempotency-Key is remembered.", gt=0)] = 7 * 86400.0
    idempotency_purge_seconds: Annotated[float, doc("How often expired Idempotency-Keys are purged.", gt=0)] = 3600.0
    idempotency_key_max_length: Annotated[int, doc("Longest accepted Idempotency-Key header.", ge=1)] = 160
    display_timezone: Annotated[
        str,
        doc(
            "IANA time zone of the times written into /new_dialog and read in recall time expressions (empty: the machine's local zone; an unknown name is refused at start)."
        ),
    ] = ""
    api_page_max: Annotated[int, doc("Largest page size of the /api/characters listings.", ge=1)] = 1000
    case_insensitive_root: Annotated[
        str,
        doc(
            "Whether the memory root's file system folds case (Windows, macOS): 'auto' probes it at start-up with a "
            "file; 'yes' or 'no' decide. On such a root every spelling of a name ('Neko', 'neko', 'NEKO') is served as "
            "one character, under the spelling of its folder (see docs/OPERATIONS.md: case-insensitive disks)."
        ),
    ] = "auto"
    name_max_length: Annotated[
        int, doc("Longest accepted character name, in characters (the reference's request limit).", ge=1, le=200)
    ] = 50
    name_max_units: Annotated[
        int, doc("Longest accepted character name in the reference's units: 1 per ASCII character, 2 per other character.", ge=1, le=400)
    ] = 60
    message_max_chars: Annotated[int, doc("Longest accepted message content in characters; longer ones get 422.", ge=1)] = 200_000
    opaque_max_depth: Annotated[
        int,
        doc(
            "Deepest nesting accepted in an opaque JSON value (a fact's source); deeper ones get 422, and one found on disk is dropped.",
            ge=1,
            le=64,
        ),
    ] = 8
    opaque_max_bytes: Annotated[
        int, doc("Largest opaque JSON value (a fact's source) in bytes; larger ones get 422, and one found on disk is dropped.", ge=64)
    ] = 4096
    body_max_depth: Annotated[
        int,
        doc(
            "Deepest JSON nesting accepted in what a route reads of a request body (unknown fields are skipped unread); deeper bodies get 400.",
            ge=4,
            le=200,
        ),
    ] = 32
    batch_max_messages: Annotated[int, doc("Most messages accepted in one write request.", ge=1)] = 10_000
    character_hold_timeout_seconds: Annotated[
        float,
        doc(
            "How long DELETE /api/characters/{name} and POST /api/characters/{name}/export wait for a busy character to go idle (and for another import, export or deletion of it to end) before they answer 409.",
            gt=0,
        ),
    ] = 60.0

    header_timeout_seconds: Annotated[
        float,
        doc(
            "Longest time a connection may take to send a complete request head (request line and headers), counted from the "
            "moment the server waits for one; a slower connection is answered 408 and closed.",
            gt=0,
        ),
    ] = 10.0
    body_timeout_seconds: Annotated[
        float,
        doc(
            "Longest time a request may take to send its whole body after its head (a body shorter than its Content-Length "
            "included); a slower one is answered 408 and closed.",
            gt=0,
        ),
    ] = 30.0
    keep_alive_seconds: Annotated[int, doc("An idle keep-alive connection is closed after this many seconds.", ge=1)] = 5
    max_connections: Annotated[
        int,
        doc(
            "Most client connections open at once; a connection beyond this is answered 503 'server_busy' with Retry-After at "
            "its first bytes (its request unread) and closed. Each one costs a file descriptor (see open files in docs/OPERATIONS.md).",
            ge=1,
        ),
    ] = 512
    max_concurrent_requests: Annotated[
        int,
        doc(
            "Most requests being answered at once (/health aside); one beyond this is answered 503 'server_busy' with "
            "Retry-After at once instead of queueing behind the others.",
            ge=1,
        ),
    ] = 256
    busy_retry_after_seconds: Annotated[int, doc("Retry-After (seconds) of a 503 'server_busy' answer.", ge=1)] = 1
    time_max_chars: Annotated[
        int,
        doc("Longest accepted /query_memory 'time' expression in characters; a longer one gets 422 'time_too_long'.", ge=16, le=1000),
    ] = 200
    time_max_relations: Annotated[
        int,
        doc(
            "Most relation words ('before', 'after', 'of', の, 的, 前, 後...) accepted in one /query_memory 'time' expression, "
            "a bound on how deeply it nests ('the day before the week after X'); more get 422 'time_too_deep'.",
            ge=1,
            le=32,
        ),
    ] = 8
    core_config_path: Annotated[
        str,
        doc(
            "Where core_config.json (powerful_memory_enabled, recent_memory_auto_review) is read, on every use. "
            "Empty: <memory_root>/core_config.json. A folder means <folder>/core_config.json: point it at the chat "
            "server's config folder (N.E.K.O.: the 'config' folder of its data directory) so that its switches reach nekomem."
        ),
    ] = ""
    neko_data_dir: Annotated[
        str,
        doc(
            "The N.E.K.O. data directory (the folder holding its config/ and memory/), 'auto' to look where N.E.K.O. "
            "keeps it, empty for none. From it come the defaults of memory_root (<dir>/memory: N.E.K.O.'s own memory "
            "folder, served in place, see docs/NEKO-FILES.md), master_name, context_language, core_config_path and character_cards_path (a value you set yourself wins). `nekomem neko` uses 'auto' unless set."
        ),
    ] = ""
    character_cards_path: Annotated[
        str,
        doc(
            "The reference's characters.json: each character's card (and the master's) is kept as protected persona "
            "entries, re-synced when the file changes. Empty: no card sync (set from neko_data_dir)."
        ),
    ] = ""
    instance_id: Annotated[
        str,
        doc(
            "The instance_id /health reports (the launcher checks it). Empty: the NEKO_INSTANCE_ID environment "
            "variable, else a random id drawn at start."
        ),
    ] = ""
    shutdown_enabled: Annotated[
        bool,
        doc(
            "POST /shutdown stops the server gracefully (everything flushed), as the reference's --enable-shutdown; "
            "otherwise it answers shutdown_disabled. `nekomem neko` turns it on (`serve --enable-shutdown` too)."
        ),
    ] = False
    neko_stop_grace_seconds: Annotated[
        float,
        doc(
            "`nekomem neko`: how long N.E.K.O.'s launcher gets to shut down once nekomem found N.E.K.O. on another "
            "memory server and asked it to stop (as Ctrl+C does) before it is terminated. The reference launcher's own "
            "graceful budget for its three servers is 40 s.",
            gt=0,
        ),
    ] = 60.0
    startup_continue_wait_seconds: Annotated[
        float,
        doc(
            "How long POST /internal/storage/startup/continue waits for start-up recovery to finish before answering "
            "409 (the reference's chat server gives the call 60 s).",
            gt=0,
        ),
    ] = 50.0
    health_probe_seconds: Annotated[
        float,
        doc(
            "When the port is in use at start-up, how long `nekomem serve` waits for GET /health on it to say who "
            "holds it (a nekomem server's pid and memory root).",
            gt=0,
            le=30,
        ),
    ] = 3.0
    health_app_name: Annotated[
        str,
        doc(
            "The 'app' field of /health. The reference's launcher accepts a port as its memory server only when this "
            "equals its own app name, 'N.E.K.O'; nekomem's own identity is in the 'server' field."
        ),
    ] = "N.E.K.O"
    scoped_context_max_facts: Annotated[
        int, doc("Most facts per subject listed in a /scoped_context answer (highest importance first).", ge=0)
    ] = 20
    context_language: Annotated[
        str, doc("Language of the /new_dialog text when the request names none (zh, zh-TW, ja, en, ko, ru, es, pt).")
    ] = "en"


class RuntimeSettings(Section, frozen=True):
    max_active_characters: Annotated[
        int,
        doc(
            "Most characters whose actors are alive at once; the least recently used idle one is passivated beyond this. Actors cost no thread, so this bounds memory only (see docs/ARCHITECTURE.md: about 0.3 MB per active character with a short history).",
            ge=1,
        ),
    ] = 1000
    fd_raise_soft_limit: Annotated[
        bool,
        doc(
            "Raise the process's soft open-file limit (RLIMIT_NOFILE) to its hard limit at start-up. Each active character "
            "holds 3 files and each client connection one: the active set is bounded by what the soft limit leaves (see "
            "fd_reserve), and /health reports the limits under 'files'."
        ),
    ] = True
    fd_reserve: Annotated[
        int,
        doc(
            "Open files kept aside for the process itself (sockets, models, logs, imports, SQLite temporary files) when the "
            "active set is sized from the open-file limit: at most (soft limit - fd_reserve - max_connections) / 3 characters "
            "are active.",
            ge=16,
        ),
    ] = 128
    passivate_idle_seconds: Annotated[float, doc("A character idle this long has its actors stopped (state stays on disk).", gt=0)] = 600.0
    actor_workers: Annotated[
        int,
        doc(
            "Threads that run the actors of every character (one shared dispatcher; an actor costs no thread of its own). "
            "More threads than cores only add contention for the interpreter lock: 2 measured less CPU per request than 4.",
            ge=1,
            le=256,
        ),
    ] = 2
    gc_full_collection_seconds: Annotated[
        float,
        doc(
            "Python's automatic full garbage collections (a walk of every live object that stalls every request: ~0.3 s with 1,000 active characters on a 2-core machine, several times while characters are being activated) are replaced by one at most this often, when the process did anything since the last one, and sooner once a quarter of the active characters have been passivated since. 0: Python's own rule.",
            ge=0,
        ),
    ] = 600.0
    actor_batch: Annotated[
        int,
        doc(
            "Messages one actor handles before its worker moves on to the next ready actor, so a flooded character cannot starve the others.",
            ge=1,
        ),
    ] = 32
    storage_reload_retry_seconds: Annotated[
        float,
        doc(
            "A layer that could not load its files on a storage fault (full, read-only or failing disk) loads them again after this many seconds by itself, doubling per failure, so /health and background work recover once the disk does, without waiting for a request.",
            gt=0,
        ),
    ] = 2.0
    storage_reload_retry_max_seconds: Annotated[float, doc("Longest wait between two such reload attempts of one layer.", gt=0)] = 60.0
    timer_retry_floor_seconds: Annotated[
        float,
        doc(
            "Work that is already due when an actor asks for its timer (e.g. a retry after the model pool was full) runs after this many real seconds, so a gate that stays open cannot spin.",
            gt=0,
        ),
    ] = 1.0
    restart_budget: Annotated[
        int, doc("Restarts of one child actor allowed within restart_window_seconds before the character is marked failed.", ge=0)
    ] = 5
    restart_window_seconds: Annotated[float, doc("Window of the restart budget.", gt=0)] = 60.0
    model_workers: Annotated[int, doc("Threads of the shared pool that runs LLM and embedding calls.", ge=1)] = 8
    model_queue_max: Annotated[
        int, doc("Most model jobs waiting for a worker; beyond this new jobs are refused and retried later.", ge=1)
    ] = 10_000
    model_jobs_per_character: Annotated[
        int, doc("Model jobs one character may run at once, so a slow model for one character leaves workers for the others.", ge=1)
    ] = 2
    replay_concurrency: Annotated[
        int, doc("Outbox records running at once per character (a record parked in a handler's batch does not count).", ge=1)
    ] = 2
    outbox_max_attempts: Annotated[int, doc("Attempts before an outbox record is dead-lettered.", ge=1)] = 5
    outbox_retry_delay_seconds: Annotated[
        float, doc("Delay before a failed outbox record is tried again the first time; it doubles with each further failure.", ge=0)
    ] = 5.0
    outbox_retry_max_delay_seconds: Annotated[float, doc("Longest delay between two attempts of a failed outbox record.", gt=0)] = 300.0
    outbox_compact_lines: Annotated[int, doc("outbox.ndjson is compacted at activation once it has this many lines.", ge=10)] = 1000
    outbox_sync_seconds: Annotated[
        float,
        doc(
            "A /cache turn's post-turn record (and its done line, when it finishes first) is held in memory and written to outbox.ndjson with the others of this many real seconds (one write and one fsync for all); its rows and the post-turn cursor are already durable in time_indexed.db, the cursor moves over the record only after that fsync (a record whose work finishes first is never written; it is acknowledged with the group), and a crash before it only means the rows after the cursor are enqueued again. 0 writes and fsyncs every record on its own.",
            ge=0,
        ),
    ] = 1.0
    events_compact_lines: Annotated[int, doc("events.ndjson is compacted once it has this many applied lines.", ge=10)] = 10_000
    view_flush_seconds: Annotated[
        float,
        doc(
            "Long-term views (facts, reflections, persona) are rewritten from the journal at most this often; the journal makes each change durable at once.",
            ge=0,
        ),
    ] = 2.0
    view_flush_max_duty: Annotated[
        float,
        doc(
            "Largest share of an actor's time spent rewriting its views: after a rewrite that took T seconds the next waits at least T / this.",
            gt=0,
            le=1,
        ),
    ] = 0.1
    view_flush_changes: Annotated[int, doc("A view is rewritten as soon as this many journaled changes are waiting.", ge=1)] = 200


def url_of(host: str, port: int) -> str:
    """The URL a browser on this machine reaches ``host:port`` at."""
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{port}"
