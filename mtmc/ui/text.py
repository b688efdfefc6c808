"""Text that is not markdown but is shown as markdown: error messages, paths and code quoted in
the chat.  `plain` escapes what markdown would turn into formatting (`__init__` into a bold
"init", `*args` into italics, `<module>` into a vanished tag, a leading `#` into a heading) and
leaves code spans in backticks, underscores inside words and list items as they are."""
from __future__ import annotations

import re

_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
_SPECIAL = re.compile(r"[\\*<~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_LINE_START = re.compile(r"^(\s{0,3})(#{1,6}(?=\s|$)|>)", re.M)   # a heading, a quote (list items may stay)


def _escape(part: str) -> str:
    part = _SPECIAL.sub(lambda m: "\\" + m.group(0), part)
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), part)


def plain(text: str) -> str:
    """`text` escaped for markdown outside its `code spans`."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_escape(text[last:m.start()]), m.group(0)]
        last = m.end()
    out.append(_escape(text[last:]))
    return "".join(out)
