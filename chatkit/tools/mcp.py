"""Tools from Model Context Protocol servers: ``MCPToolset`` (the ``mcp`` extra).

An ``MCPToolset`` connects to one MCP server, over stdio (a command chatkit starts) or
streamable HTTP (a URL), lists its tools and gives them as chatkit :class:`Tool` s: each
tool's ``inputSchema`` becomes its call grammar (refused by name when chatkit cannot enforce
it, as ``@tool`` does), its description the tool text, its ``outputSchema`` checks the
structured results. Give them to ``send(tools=...)`` or the agent loop beside Python tools::

    with MCPToolset.stdio("python weather_server.py") as weather:
        answer = conv.run("Weather in Oslo?", tools=[*weather.tools(), local_fn])

The session lives on a thread of its own with its own event loop (the MCP SDK's sessions
are bound to the task that opened them), so one toolset serves ``run`` and ``arun``, from
any thread or event loop, concurrently. Closing it (the ``with`` block's end, ``close()``,
interpreter exit) ends the session and stops the server's process.

What the model sees of a call: the structured result as JSON when the tool gave one, else
its text; a result the server marks ``isError``, a call that times out and a result the
tool's ``outputSchema`` rejects become error responses, as a raising Python tool's do.
Content a text model cannot take (images, audio, binary resources) is an error response
naming the kind, never dropped silently. A server that cannot be reached, or whose session
is gone (its process died, the connection closed), is :class:`ToolServerError` naming the
server: the agent loop stops there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import shlex
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TextIO, TypedDict, TypeVar, Unpack

from ..errors import InvalidParameter, MCPToolError, SchemaViolation, ToolServerError
from ..grammar.schema import SchemaReader
from ..messages import JSON
from .definition import Tool

__all__ = ["MCPToolset"]

_log = logging.getLogger("chatkit")


class MCPOptions(TypedDict, total=False):
    """``MCPToolset``'s options, as ``stdio`` and ``http`` pass them on."""

    timeout: float | None
    connect_timeout: float
    prefix: str
    exclude: Sequence[str]
T = TypeVar("T")

_TEXT_KINDS = {"text"}
_REFUSED_KINDS = {"image", "audio"}


def _import_mcp() -> Any:
    try:
        import mcp
    except ImportError as exc:
        raise InvalidParameter("mcp", "MCP tools need the mcp extra: pip install "
                               f"'chatkit[mcp]' ({exc})") from None
    return mcp


class MCPToolset:
    """One MCP server's tools, for ``send(tools=...)`` and the agent loop.

    Make one with :meth:`stdio` (a command) or :meth:`http` (a URL); open it with ``with``
    / ``async with`` (or :meth:`open` and :meth:`close`). ``timeout`` (seconds, None: no
    limit) bounds each call, which then becomes an error response the model sees;
    ``prefix`` is put before every tool name (two servers with a tool of the same name);
    ``exclude`` leaves tools out by their server-side name. Raises ``InvalidParameter``
    for bad arguments or a missing ``mcp`` package.
    """

    def __init__(self, target: object, *, name: str, timeout: float | None = 60.0,
                 connect_timeout: float = 30.0, prefix: str = "",
                 exclude: Sequence[str] = (), stderr: TextIO | None = None) -> None:
        for label, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not value > 0):
                raise InvalidParameter(label, f"must be a number of seconds > 0, got {value!r}")
        if not isinstance(prefix, str):
            raise InvalidParameter("prefix", f"must be a string, got {prefix!r}")
        self.name = name
        """The server as errors and logs name it (the command or the URL)."""
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.prefix = prefix
        self.exclude = frozenset(exclude)
        self._listing: list[Any] | None = None
        self._session = _Session(target, name=name, connect_timeout=connect_timeout,
                                 stderr=stderr, on_tools_changed=self._forget_listing)

    # ------------------------------------------------------------------ making
    @classmethod
    def stdio(cls, command: str | Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None, stderr: TextIO | None = None,
              **options: Unpack[MCPOptions]) -> MCPToolset:
        """A server chatkit starts as a subprocess and talks to over stdin/stdout.

        ``command`` is a shell-like string (split with ``shlex``) or an argument list;
        ``env`` is added to a minimal default environment (the SDK's), ``cwd`` is where it
        runs, ``stderr`` where its log goes (default: this process's stderr)."""
        mcp = _import_mcp()
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise InvalidParameter("command", f"must name a program, got {command!r}")
        params = mcp.StdioServerParameters(command=argv[0], args=argv[1:],
                                           env=dict(env) if env else None,
                                           cwd=os.fspath(cwd) if cwd is not None else None)
        return cls(params, name=" ".join(argv), stderr=stderr, **options)

    @classmethod
    def http(cls, url: str, **options: Unpack[MCPOptions]) -> MCPToolset:
        """A server reached over streamable HTTP at ``url`` (e.g. ``http://host:8000/mcp``)."""
        _import_mcp()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidParameter("url", f"must be an http(s) URL, got {url!r}")
        return cls(url, name=url, **options)

    # --------------------------------------------------------------- lifecycle
    def open(self) -> MCPToolset:
        """Start the session (idempotent). Waits up to ``connect_timeout`` for the server;
        raises ``ToolServerError`` when it cannot be started or reached."""
        self._session.open()
        return self

    def close(self) -> None:
        """End the session and stop the server's process (idempotent; waits for it)."""
        self._session.close()

    def __enter__(self) -> MCPToolset:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MCPToolset:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.open)

    async def __aexit__(self, *exc: object) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.close)

    def _forget_listing(self) -> None:
        """The server's tool list changed: list it again when next asked."""
        self._listing = None

    # ------------------------------------------------------------------- calls
    def _list(self) -> list[Any]:
        if self._listing is None:
            async def fetch(client: Any) -> list[Any]:
                tools: list[Any] = []
                cursor = None
                while True:
                    page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        return tools

            future = self._session.submit(lambda client: fetch(client))
            try:
                self._listing = _wait(future, self.connect_timeout)
            except TimeoutError as exc:
                raise self._session.gone(f"tools/list got no answer within {self.connect_timeout} s"
                                 ) from exc
        return self._listing

    def tools(self) -> list[Tool]:
        """The server's tools as chatkit tools (opens the session if needed). Listed once
        and cached until the server says its list changed (``tools/list_changed``).
        Raises ``ToolDefinitionError`` naming a tool whose input schema chatkit cannot
        enforce (leave it out with ``exclude=``), ``ToolServerError`` when the server
        cannot be reached."""
        self.open()
        return [self._tool(spec) for spec in self._list() if spec.name not in self.exclude]

    async def atools(self) -> list[Tool]:
        """:meth:`tools` for async code (the listing runs in a worker thread)."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.tools)

    def _tool(self, spec: Any) -> Tool:
        remote = spec.name
        reader = (SchemaReader(spec.output_schema)
                  if isinstance(spec.output_schema, dict) else None)

        async def call(**arguments: Any) -> str:
            return await self.acall(remote, arguments, _reader=reader)

        call.__name__ = remote
        description = spec.description or spec.title or ""
        made = Tool.from_schema(self.prefix + remote, dict(spec.input_schema or {}),
                                description, function=call)
        made.timeout = self.timeout
        return made

    async def acall(self, name: str, arguments: Mapping[str, JSON], *,
                    _reader: SchemaReader | None = None) -> str:
        """Call the server's tool ``name`` (its own name, without ``prefix``) and return
        what the model would see. Raises ``MCPToolError`` (an ``isError`` result, content
        a text model cannot take, a structured result its ``outputSchema`` rejects), which
        the agent loop turns into an error response, and ``ToolServerError``."""
        import anyio.to_thread

        future = self._session.submit(lambda client: client.call_tool(name, dict(arguments)))
        try:
            result = await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            if not future.done():
                future.cancel()  # a timeout or a cancelled loop: the request is dropped
        return self._content(name, result, _reader)

    def call(self, name: str, arguments: Mapping[str, JSON]) -> str:
        """:meth:`acall` for sync code (waits up to ``timeout``: ``TimeoutError``)."""
        reader = None
        for spec in self._list():
            if spec.name == name and isinstance(spec.output_schema, dict):
                reader = SchemaReader(spec.output_schema)
        future = self._session.submit(lambda client: client.call_tool(name, dict(arguments)))
        return self._content(name, _wait(future, self.timeout), reader)

    def _content(self, name: str, result: Any, reader: SchemaReader | None) -> str:
        texts: list[str] = []
        refused: list[str] = []
        for item in result.content or []:
            kind = getattr(item, "type", "?")
            if kind == "text":
                texts.append(item.text)
            elif kind == "resource_link":
                texts.append(json.dumps({"resource_link": str(item.uri), "name": item.name}))
            elif kind == "resource" and hasattr(item.resource, "text"):
                texts.append(item.resource.text)
            else:
                refused.append("binary resource" if kind == "resource" else kind)
        if result.is_error:
            raise MCPToolError(name, "\n".join(texts) or "the tool reported an error")
        if refused:
            _log.warning("MCP tool %s returned %s content, which a text model cannot take",
                         name, ", ".join(refused))
            raise MCPToolError(name, f"returned {', '.join(refused)} content, which chatkit "
                               "cannot give a text model")
        structured = result.structured_content
        if structured is not None:
            if reader is not None:
                try:
                    reader.read(json.dumps(structured))
                except SchemaViolation as exc:
                    raise MCPToolError(name, "its structured result does not match its "
                                       f"outputSchema: {'; '.join(exc.errors)}") from exc
            return json.dumps(structured, ensure_ascii=False)
        return "\n".join(texts)

    def __repr__(self) -> str:
        return f"MCPToolset({self.name!r}, {self._session.state()})"


class _Session:
    """The MCP client session of one toolset, on a thread of its own with its own event loop
    (the MCP SDK's sessions are bound to the task that opened them): :meth:`submit` runs work
    on it from any thread. ``on_tools_changed`` is called, on the session's loop, when the
    server says its tool list changed."""

    def __init__(self, target: Any, *, name: str, connect_timeout: float,
                 stderr: TextIO | None, on_tools_changed: Callable[[], None]) -> None:
        self.name = name
        self.connect_timeout = connect_timeout
        self._on_tools_changed = on_tools_changed
        self._target = target
        self._stderr = stderr
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._up = threading.Event()
        """The session came up (a close before that cancels the connecting task)."""

    def state(self) -> str:
        """``open``, ``ended`` or ``not open``."""
        return ("open" if self._client is not None else
                "ended" if self._ended.is_set() else "not open")

    def open(self) -> None:
        """Start the session (idempotent). Waits up to ``connect_timeout`` for the server;
        raises ``ToolServerError`` when it cannot be started or reached."""
        with self._lock:
            starting = self._thread is None
            if starting:
                self._thread = threading.Thread(target=self._thread_main, daemon=True,
                                                name=f"chatkit-mcp {self.name}")
                self._thread.start()
        if not starting:  # opened, or being opened by another thread: wait for it
            self._ready.wait(self.connect_timeout)
            if self._client is None:
                raise self.gone("the session is not open" if not self._ended.is_set()
                                else "the session has ended")
            return
        if not self._ready.wait(self.connect_timeout):
            self.close()
            raise ToolServerError(self.name, f"no session within {self.connect_timeout} s")
        if self._client is None:
            failure = self._failure
            self.close()
            raise ToolServerError(self.name, f"could not connect: {_describe(failure)}"
                                  ) from failure
        # runs at interpreter exit (the session's thread holds the session, and through
        # on_tools_changed the toolset, while it lives)
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._stop,
                                           self._thread, self._task, self._up)
        _log.info("MCP server %s: connected", self.name)

    def close(self) -> None:
        """End the session and stop the server's process (idempotent; waits for it)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _shutdown(self._loop, self._stop, self._thread, self._task, self._up)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._failure = self._failure or exc
        finally:
            self._ready.set()
            self._ended.set()

    async def _main(self) -> None:
        mcp = _import_mcp()
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._task = asyncio.current_task()
        target = self._target
        if isinstance(target, mcp.StdioServerParameters):
            from mcp.client.stdio import stdio_client

            target = stdio_client(target, errlog=self._stderr or sys.stderr)
        try:
            async with mcp.Client(target, message_handler=self._on_message) as client:
                self._client = client
                self._up.set()
                listener = asyncio.create_task(self._listen(client))
                self._ready.set()
                try:
                    await self._stop.wait()
                finally:
                    listener.cancel()
                    await asyncio.gather(listener, return_exceptions=True)
        except BaseException as exc:
            self._failure = exc
            if not self._ready.is_set():
                return
            _log.warning("MCP server %s: the session ended: %s", self.name, _describe(exc))
        finally:
            self._client = None

    async def _listen(self, client: Any) -> None:
        """Tool-list changes on a 2026-07-28 connection come through a subscription;
        older ones send ``notifications/tools/list_changed`` (:meth:`_on_message`)."""
        from mcp.client.subscriptions import ListenNotSupportedError

        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    _log.info("MCP server %s: its tool list changed", self.name)
                    self._on_tools_changed()
        except ListenNotSupportedError:
            return
        except Exception as exc:  # the server declined: changes are then not seen
            _log.info("MCP server %s: no tool-list subscription (%s)", self.name,
                      _describe(exc))

    async def _on_message(self, message: Any) -> None:
        root = getattr(message, "root", message)
        method = getattr(root, "method", None)
        if method == "notifications/tools/list_changed":
            _log.info("MCP server %s: its tool list changed", self.name)
            self._on_tools_changed()

    def gone(self, what: str) -> ToolServerError:
        failure = self._failure
        detail = f": {_describe(failure)}" if failure is not None else ""
        return ToolServerError(self.name, f"{what}{detail}")

    def submit(self, work: Callable[[Any], Coroutine[Any, Any, T]]
                ) -> concurrent.futures.Future[T]:
        """Run ``work(client)`` on the session's loop; ``ToolServerError`` when there is no
        live session (checked before the client is touched)."""
        loop, client = self._loop, self._client
        if client is None or loop is None or self._ended.is_set():
            raise self.gone("the session is not open" if self._thread is None
                             else "the session has ended")
        return asyncio.run_coroutine_threadsafe(self._guarded(work(client)), loop)

    def _dead(self) -> bool:
        return self._ended.is_set() or self._client is None

    async def _guarded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the session's loop: a dead session is ToolServerError; any other failure
        (an error the server sent, a result the SDK rejects) is raised as it is, and the
        agent loop shows it to the model."""
        from mcp.shared.exceptions import MCPError

        try:
            return await coro
        except MCPError as exc:
            if exc.code == -32000 or self._dead():
                raise self.gone(f"the session is gone ({exc.error.message})") from exc
            raise
        except (OSError, EOFError) as exc:
            raise self.gone(f"the session is gone ({type(exc).__name__}: {exc})") from exc
        except RuntimeError as exc:
            if self._dead():
                raise self.gone(f"the session is gone ({exc})") from exc
            raise
        except Exception as exc:
            import anyio

            if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError
                          | anyio.EndOfStream):
                raise self.gone("the session is gone") from exc
            raise


def _wait(future: concurrent.futures.Future[T], timeout: float | None) -> T:
    """``future``'s result; ``TimeoutError`` (the future cancelled) after ``timeout`` s."""
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer within {timeout} s") from None


def _shutdown(loop: asyncio.AbstractEventLoop | None, stop: asyncio.Event | None,
              thread: threading.Thread | None, task: asyncio.Task[Any] | None = None,
              up: threading.Event | None = None) -> None:
    """Ask the session's loop to end the session (a session still connecting is
    cancelled), and wait for its thread (a module function: the finalizer must not hold
    the toolset)."""
    if loop is not None and stop is not None and not loop.is_closed():
        try:
            loop.call_soon_threadsafe(stop.set)
            if task is not None and up is not None:
                loop.call_soon_threadsafe(_cancel_unless_up, task, up)
        except RuntimeError:  # the loop closed meanwhile
            pass
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=30)


def _cancel_unless_up(task: asyncio.Task[Any], up: threading.Event) -> None:
    """On the session's loop: a session that never came up (the server never answered
    ``initialize``) is cancelled, which stops its process; a live one ends by ``stop``."""
    if not task.done() and not up.is_set():
        task.cancel()


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no reason given"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
