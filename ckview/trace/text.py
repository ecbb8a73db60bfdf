"""printable: strings from a trace made safe to print on a terminal or draw in the GUI.

NOTE [ Strings from a trace are escaped once, by the reader ]
Module paths, op names, the recorded command, error texts and run names come from the file, and
a crafted file can put terminal controls in them (ESC sequences that clear the screen or retitle
the window, \\r and \\b that overwrite a line, bidi overrides that reorder it). The reader passes
every string it hands out through ``printable`` (the string table, /meta, run names), so every
CLI verb, export and the GUI print escaped text without each having to remember to.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character that ``str.isprintable`` rejects (controls, format and
    bidi characters, line and paragraph separators) written as a ``\\x..``/``\\u..`` escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
