"""HTML that escapes by default: a ``str`` is always escaped, only `Html`
(made by `tag` and `raw`) is written as it is.

Every page is built from `tag` calls, so a value read from the store (a job
id, an error, a run's output) cannot become markup unless someone wraps it
in `raw`, which nothing here does with stored data.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

# Elements with no end tag.
_VOID = frozenset({"br", "input", "link", "meta", "hr", "img"})


class Html(str):
    """Markup that is already safe to write."""

    __slots__ = ()


def raw(markup: str) -> Html:
    """Trusted markup as it is: for this module's own constants only."""
    return Html(markup)


def text(value: Any) -> Html:
    """``value`` as HTML text: Html as it is, anything else escaped (None: nothing)."""
    if value is None:
        return Html("")
    if isinstance(value, Html):
        return value
    if isinstance(value, str | int | float):
        return Html(escape(str(value), quote=True))
    return Html("".join(text(v) for v in value))


def tag(name: str, /, *children: Any, **attrs: str | int | float | bool | None) -> Html:
    """``<name attrs>children</name>``: attribute values escaped; a trailing
    underscore is dropped from a name (``class_``) and others take dashes for
    underscores (``data_part`` is ``data-part``); False or None leaves the
    attribute out, True writes it bare."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        attr = key[:-1] if key.endswith("_") else key.replace("_", "-")
        parts.append(attr if value is True else f'{attr}="{escape(str(value), quote=True)}"')
    opening = f"<{' '.join(parts)}>"
    if name in _VOID:
        return Html(opening)
    return Html(f"{opening}{text(children)}</{name}>")


@dataclass(frozen=True, slots=True)
class Post:
    """A button that POSTs ``fields`` as a form to ``action``."""

    action: str
    fields: dict[str, str]
    label: str


@dataclass(frozen=True, slots=True)
class Cell:
    """One table cell, written as HTML by `cell_html` and sent as JSON to
    the page's script, which builds the same DOM with textContent: one
    source for both, and the browser never parses stored text as markup."""

    text: str = ""
    href: str | None = None
    cls: str | None = None
    title: str | None = None
    # A bar before the text, 0 to 100 (% of its column's width).
    bar: float | None = None
    post: Post | None = None
    # Lines folded under the text, shown when it is clicked (a <details>
    # whose summary is the text): a row that stands for many.
    details: tuple[str, ...] | None = None

    def json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"text": self.text}
        for key in ("href", "cls", "title", "bar"):
            if getattr(self, key) is not None:
                shown[key] = getattr(self, key)
        if self.details is not None:
            shown["details"] = list(self.details)
        if self.post is not None:
            shown["post"] = {"action": self.post.action, "fields": self.post.fields, "label": self.post.label}
        return shown


@dataclass(frozen=True, slots=True)
class Part:
    """A table the page's script refreshes: its rows and the caption above it."""

    columns: tuple[str, ...]
    rows: list[list[Cell]]
    empty: str
    caption: str = ""

    def json(self) -> dict[str, Any]:
        return {"rows": [[c.json() for c in row] for row in self.rows], "empty": self.empty, "caption": self.caption}


def bar_svg(pct: float) -> Html:
    # An SVG rect, not a styled div: the page's Content-Security-Policy
    # allows no inline styles.
    width = f"{max(0.0, min(100.0, pct)):.1f}"
    return tag(
        "svg",
        tag("rect", width=width, height="10"),
        class_="bar",
        viewBox="0 0 100 10",
        preserveAspectRatio="none",
        aria_hidden="true",
    )


def cell_html(cell: Cell) -> Html:
    content: list[Html] = []
    if cell.bar is not None:
        content.append(bar_svg(cell.bar))
    if cell.post is not None:
        hidden = [tag("input", type="hidden", name=k, value=v) for k, v in cell.post.fields.items()]
        content.append(
            tag("form", *hidden, tag("button", cell.post.label, type="submit"), method="post", action=cell.post.action)
        )
    elif cell.href is not None:
        content.append(tag("a", cell.text, href=cell.href))
    elif cell.details is not None:
        content.append(
            tag("details", tag("summary", cell.text), tag("ul", *(tag("li", line) for line in cell.details)))
        )
    else:
        content.append(text(cell.text))
    return tag("td", *content, class_=cell.cls, title=cell.title)


def part_html(name: str, part: Part) -> Html:
    head = tag("thead", tag("tr", *(tag("th", c) for c in part.columns)))
    rows = (
        [tag("tr", *(cell_html(c) for c in row)) for row in part.rows]
        if part.rows
        else [tag("tr", tag("td", part.empty, colspan=len(part.columns), class_="empty"))]
    )
    return Html(
        tag("p", part.caption, class_="caption", data_caption=name)
        + tag("table", head, tag("tbody", *rows, data_part=name, data_columns=len(part.columns)))
    )
