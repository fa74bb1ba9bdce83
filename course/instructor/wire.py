"""Calls across two processes that do not trust each other: length-prefixed JSON messages over two
file descriptors, each side answering the other's requests while it waits for its own reply (the
learner's function calling a function the check passed it). What the messages hold is `codec`'s.
"""

import builtins
import json
import os
import struct

from .codec import Codec, Remote, WireError, _lookup, _name_of, _no_collection, _reached

__all__ = ["Channel", "Codec", "Gone", "Remote", "RemoteError", "WireError", "receive", "send"]

BUILTIN_ERRORS = {name: getattr(builtins, name) for name in (
    "ArithmeticError", "AssertionError", "AttributeError", "Exception", "FloatingPointError", "IndexError",
    "KeyError", "LookupError", "MemoryError", "NameError", "NotImplementedError", "OverflowError",
    "RecursionError", "RuntimeError", "StopIteration", "TypeError", "UnboundLocalError", "ValueError",
    "ZeroDivisionError", "ImportError", "ModuleNotFoundError")}
LARGEST = 256 << 20  # bytes in one message: more is refused, not read


class RemoteError(Exception):
    """An exception of a type this side does not rebuild, raised on the other side."""

    def __init__(self, type_name, message):
        super().__init__(message)
        self.type_name = type_name

    def __str__(self):
        return self.args[0]


class Gone(Exception):
    """The other side closed the channel or died."""


# ---- the channel: length-prefixed JSON messages over two file descriptors ----

def send(fd, message):
    with _no_collection():
        data = json.dumps(message, allow_nan=True).encode()
    if len(data) > LARGEST:
        raise WireError(f"a message of {len(data) >> 20} MB: more than the {LARGEST >> 20} MB one call may send")
    os.write(fd, struct.pack("<Q", len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise Gone("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd):
    (size,) = struct.unpack("<Q", _read_exactly(fd, 8))
    if size > LARGEST:
        raise WireError(f"a message of {size >> 20} MB: more than the {LARGEST >> 20} MB one call may send")
    data = _read_exactly(fd, size)
    try:
        with _no_collection():
            return json.loads(data)
    except ValueError:
        raise WireError("a message that is not JSON") from None


class Channel:
    """Requests and replies in both directions: while one side waits for its reply, it serves the
    other side's requests (the learner's function calling a function the check passed it)."""

    def __init__(self, side, read_fd, write_fd):
        self.codec = Codec(side)
        self.codec.channel = self
        self.read_fd, self.write_fd = read_fd, write_fd

    def request(self, message):
        send(self.write_fd, message)
        while True:
            reply = receive(self.read_fd)
            kind = reply.get("op")
            if kind == "return":
                # The value first: it defines the new objects that the changed ones may now hold.
                value = self.codec.decode(reply["value"])
                self.codec.apply(reply["states"])
                return value
            if kind == "raise":
                self.codec.apply(reply["states"])
                raise _rebuild(reply.get("type", "Exception"), str(reply.get("message", "")))
            self.serve_one(reply)

    def serve_one(self, message):
        """Carry out one request of the other side and send the reply, with the contents of the
        shared objects it names in "sync" (what a call may have changed in its arguments)."""
        codec = self.codec
        codec.touched = set()
        target = None
        try:
            target = codec._val(message["target"])
            value = self._carry_out(message, target)
            reply = {"op": "return", "value": codec.encode(value)}
        except (Gone, KeyboardInterrupt):
            raise
        except BaseException as err:  # noqa: BLE001 - whatever the called code raised goes back
            reply = {"op": "raise", "type": _type_name(err), "message": _message(err)}
        # What the request may have changed: what it sent or named, and what its target reaches.
        sync = codec.touched | (_reached(codec, target) if target is not None else set())
        reply["states"] = codec.states(sorted(sync))
        send(self.write_fd, reply)

    def _carry_out(self, message, target):
        kind = message.get("op")
        args = self.codec.decode(message.get("args"))
        kwargs = self.codec.decode(message.get("kwargs"))
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise WireError("a request whose arguments are not a tuple and a dict")
        if kind == "call":
            return target(*args, **kwargs)
        if kind == "within":  # a call inside a context of a lesson object: `with graph.as_default():`
            owner, method, *rest = args
            if not _name_of(type(owner)) or not isinstance(method, str) or method.startswith("_"):
                raise WireError("a context that is not a lesson object's method")
            with getattr(owner, method)():
                return target(*rest, **kwargs)
        if kind in ("getattr", "setattr"):
            if not isinstance(args[0], str) or args[0].startswith("__"):
                raise AttributeError(f"no attribute {args[0]!r} across the channel")
            return getattr(target, args[0]) if kind == "getattr" else setattr(target, args[0], args[1])
        if kind == "getitem":
            return target[args[0]]
        if kind == "setitem":
            target[args[0]] = args[1]
            return None
        if kind == "len":
            return len(target)
        if kind == "list":
            return list(target)
        if kind == "contains":
            return args[0] in target
        if kind == "repr":
            return repr(target)
        if kind == "bool":
            return bool(target)
        if kind == "classes":
            cls = target if isinstance(target, type) else type(target)
            return isinstance(target, type), [f"{c.__module__}:{c.__qualname__}" for c in cls.__mro__]
        raise WireError(f"no request {kind!r}")


def _type_name(err):
    cls = type(err)
    return _name_of(cls) or cls.__name__ if cls.__module__ != "builtins" else cls.__name__


def _message(err):
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - a learner's exception whose __str__ fails
        text = "(no message)"
    if isinstance(err, KeyError) and err.args:
        text = repr(err.args[0]) if len(err.args) == 1 else text
    return text[:2000]


def _rebuild(type_name, message):
    cls = BUILTIN_ERRORS.get(type_name)
    if cls is not None:
        return cls(message) if type_name != "KeyError" else KeyError(message)
    if type_name == "SystemExit":
        return RemoteError(type_name, f"SystemExit: {message}")
    if ":" in type_name:
        try:
            cls = _lookup(type_name)
            if isinstance(cls, type) and issubclass(cls, Exception):
                return cls(message)
        except Exception:  # noqa: BLE001 - not a class we can rebuild: say what it was
            pass
        if type_name.endswith(":CheckFailed"):
            from course.exercises import CheckFailed

            return CheckFailed(message)
    return RemoteError(type_name, message)
