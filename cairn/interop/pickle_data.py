"""A pickle read as data, never run: the opcodes (``pickletools.genops``, a decoder that imports
and calls nothing) are interpreted by a small machine that builds only plain values (None, bool,
int, float, str, bytes, tuple, list, dict) and records, without importing or calling it, what
the pickle would build: ``Global`` (a class or function it names; one outside the caller's
allowlist is refused at once), ``Built`` (a call of one, with the state set on the result) and
``Persistent`` (a ``torch.save`` storage reference). Any other opcode is refused.

What a pickle could make Python do (import a module, call a function, set an attribute) cannot
happen here: nothing is resolved, so a payload naming ``os.system`` is a refusal, not a call.
Dict keys are limited to str, int and ``Built``, so nothing deep is ever hashed; the caller
bounds the bytes before they get here."""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import Any

from cairn.errors import CairnError

__all__ = ["MAX_VALUES", "Built", "Global", "Persistent", "read_pickle"]


@dataclass(frozen=True)
class Global:
    """A class or function the pickle names (``GLOBAL``, ``STACK_GLOBAL``): never imported."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Built:
    """What the pickle would build by calling ``call`` with ``args`` (``NEWOBJ``, ``REDUCE``) and
    then setting ``state`` on it (``BUILD``): only recorded."""

    call: Global
    args: tuple[Any, ...]
    state: Any = None


@dataclass(frozen=True, eq=False)
class Persistent:
    """A persistent id (``BINPERSID``; ``torch.save``: which storage a tensor views): only recorded."""

    pid: Any


_ARGUMENT = frozenset(
    {
        "BININT",
        "BININT1",
        "BININT2",
        "LONG1",
        "BINFLOAT",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "SHORT_BINBYTES",
        "BINBYTES",
        "BINBYTES8",
    }
)
"""Opcodes that push the value the decoder read from the stream."""
_CONSTANT = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_MAX_PROTOCOL = 5
_NEW = _ARGUMENT | {"EMPTY_DICT", "EMPTY_LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT"}
_NEW |= {"GLOBAL", "STACK_GLOBAL", "NEWOBJ", "REDUCE", "BINPERSID"}
"""Opcodes that make a new value (the others move or reuse one)."""
MAX_VALUES = 1 << 22
"""Opcodes a pickle may run that make or hold a value (a new value, a MARK's list, a memo entry,
a push of one already made): each costs up to ~100 bytes for one byte of pickle."""
_HELD = frozenset({"MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", *_CONSTANT})
"""Opcodes that grow the stack, the marks or the memo without making a new value."""


class _Refused(Exception):
    """Inside the machine: the pickle is refused (``expected``, ``found``)."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(found)
        self.expected = expected
        self.found = found


def _kind(value: Any) -> str:
    """A value's kind for a message: never its repr (a pickle may nest without end)."""
    return type(value).__name__


class _Machine:
    def __init__(self, allowed: frozenset[tuple[str, str]], what: str, persistent: bool) -> None:
        self.allowed = allowed
        self.what = what
        self.persistent = persistent
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}

    def push(self, value: Any) -> None:
        self.stack.append(value)  # not a bound ``self.stack.append``: MARK and pop_mark swap the list

    def pop(self) -> Any:
        if not self.stack:
            raise _Refused("a well-formed pickle", "a pop from an empty stack")
        return self.stack.pop()

    def top(self, kind: type) -> Any:
        if not self.stack or not isinstance(self.stack[-1], kind):
            raise _Refused(f"a {kind.__name__} to add to", _kind(self.stack[-1]) if self.stack else "an empty stack")
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise _Refused("a well-formed pickle", "no MARK to pop to")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def name(self, module: Any, name: Any) -> Global:
        if not (isinstance(module, str) and isinstance(name, str)):
            raise _Refused(self.what, f"a name made of {_kind(module)} and {_kind(name)}")
        if (module, name) not in self.allowed:
            raise _Refused(self.what, str(Global(module, name)))
        return Global(module, name)

    def set_items(self, target: dict[Any, Any], items: list[Any]) -> None:
        if len(items) % 2:
            raise _Refused("key, value pairs", f"{len(items)} items")
        for key, value in zip(items[::2], items[1::2], strict=True):
            if not isinstance(key, str | int | Built):
                raise _Refused("str, int or object keys", _kind(key))
            target[key] = value

    def build(self, callee: Any, args: Any) -> Built:
        if not isinstance(callee, Global) or not isinstance(args, tuple):
            raise _Refused("an allowed class called with a tuple", f"{_kind(callee)} called with {_kind(args)}")
        return Built(callee, args)

    def step(self, op: str, arg: Any) -> None:
        """One opcode, as pickle's own machine would run it, less every import and call."""
        push = self.push
        if op in ("PROTO", "FRAME"):
            if op == "PROTO" and not 0 <= arg <= _MAX_PROTOCOL:
                raise _Refused(f"pickle protocol <= {_MAX_PROTOCOL}", str(arg))
        elif op in _ARGUMENT:
            push(arg)
        elif op in _CONSTANT:
            push(_CONSTANT[op])
        elif op == "MARK":
            self.marks.append(self.stack)
            self.stack = []
        elif op == "EMPTY_DICT":
            push({})
        elif op == "EMPTY_LIST":
            push([])
        elif op == "TUPLE":
            push(tuple(self.pop_mark()))
        elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(op[-1])
            if len(self.stack) < n:
                raise _Refused("a well-formed pickle", f"{op} on {len(self.stack)} items")
            items = self.stack[-n:]
            del self.stack[-n:]
            push(tuple(items))
        elif op == "LIST":
            push(self.pop_mark())
        elif op == "DICT":
            body: dict[Any, Any] = {}
            self.set_items(body, self.pop_mark())
            push(body)
        elif op == "APPEND":
            value = self.pop()
            self.top(list).append(value)
        elif op == "APPENDS":
            items = self.pop_mark()
            self.top(list).extend(items)
        elif op == "SETITEM":
            value, key = self.pop(), self.pop()
            self.set_items(self.top(dict), [key, value])
        elif op == "SETITEMS":
            items = self.pop_mark()
            self.set_items(self.top(dict), items)
        elif op == "MEMOIZE":
            self.memo[len(self.memo)] = self.top(object)
        elif op in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = self.top(object)
        elif op in ("BINGET", "LONG_BINGET"):
            if arg not in self.memo:
                raise _Refused("a memo entry put before", f"get {arg}")
            push(self.memo[arg])
        elif op == "GLOBAL":
            module, _, name = str(arg).partition(" ")
            push(self.name(module, name))
        elif op == "STACK_GLOBAL":
            name = self.pop()
            push(self.name(self.pop(), name))
        elif op in ("NEWOBJ", "REDUCE"):
            args = self.pop()
            push(self.build(self.pop(), args))
        elif op == "BUILD":
            state = self.pop()
            target = self.top(Built)
            if target.state is not None:
                raise _Refused("one BUILD per object", f"a second BUILD of {target.call}")
            target.state = state
        elif op == "BINPERSID" and self.persistent:
            push(Persistent(self.pop()))
        else:
            raise _Refused("the opcodes of plain data and allowed classes", f"opcode {op}")


def read_pickle(
    raw: bytes,
    allowed: frozenset[tuple[str, str]],
    *,
    where: str,
    what: str,
    error: type[CairnError],
    persistent: bool = False,
    max_values: int = MAX_VALUES,
) -> Any:
    """The value pickled in ``raw``, as data (see the module docstring). ``allowed``: the
    ``(module, name)`` pairs it may name; anything else is refused with ``error`` naming
    ``where``, expected ``what``, found ``module.name``. ``persistent``: persistent ids allowed;
    ``max_values``: how many values it may make."""
    machine = _Machine(allowed, what, persistent)

    def make(expected: str, found: str) -> CairnError:
        return error("refused: a pickle is read as data only", field=where, expected=expected, found=found)

    made = 0
    try:
        for opcode, arg, _ in pickletools.genops(raw):
            made += opcode.name in _NEW or opcode.name in _HELD
            if made > max_values:
                raise _Refused(f"<= {max_values} values", "more")
            if opcode.name == "STOP":
                if len(machine.stack) != 1 or machine.marks:
                    raise _Refused("one value at STOP", f"{len(machine.stack)} values")
                return machine.stack[0]
            machine.step(opcode.name, arg)
    except _Refused as exc:
        raise make(exc.expected, exc.found) from None
    except ValueError as exc:  # the decoder's: an unknown opcode, a truncated argument, bad UTF-8
        raise make("a well-formed pickle", str(exc).splitlines()[0][:200] if str(exc) else "malformed") from None
    raise make("a well-formed pickle", "no STOP")
