"""Tables the pages show and export: raw rows (JSON, CSV) and how each column is printed (HTML)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

Format = Callable[[Any], str]


def plain(value: Any) -> str:
    """Text of a value; a dash for None or an empty value."""
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else "∞"
    return str(value)


def fixed(digits: int) -> Format:
    """A number printed with ``digits`` decimals (what the browser test compares at)."""
    return lambda v: "–" if v is None else (f"{v:.{digits}f}" if math.isfinite(v) else "∞")


@dataclass(frozen=True)
class Column:
    """One column: the row key, its header (with unit), how a cell is printed."""

    key: str
    header: str
    fmt: Format = plain


@dataclass(frozen=True)
class Table:
    """A named table; ``name`` selects it in ``?format=csv&table=name``."""

    name: str
    caption: str
    columns: Sequence[Column]
    rows: Sequence[dict[str, Any]]
    link: Callable[[dict[str, Any]], str] | None = None  # first column as a link to this URL

    def html(self, path: str) -> str:
        """The table with a caption and its CSV/JSON export links."""
        head = "".join(f'<th scope="col">{escape(c.header)}</th>' for c in self.columns)
        body = "".join(self._row(row) for row in self.rows) or (
            f'<tr><td colspan="{len(self.columns)}">none</td></tr>'
        )
        csv_url = escape(path + "?" + urlencode({"format": "csv", "table": self.name}))
        json_url = escape(path + "?" + urlencode({"format": "json", "table": self.name}))
        return (
            f'<table id="t-{escape(self.name)}"><caption>{escape(self.caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f'<p class="export">Export: <a href="{csv_url}">CSV</a> · <a href="{json_url}">JSON</a></p>'
        )

    def _row(self, row: dict[str, Any]) -> str:
        """One <tr>; cells carry data-key so tests can find a value."""
        cells = []
        for index, column in enumerate(self.columns):
            text = escape(column.fmt(row.get(column.key)))
            if index == 0 and self.link is not None:
                text = f'<a href="{escape(self.link(row))}">{text}</a>'
            tag = 'th scope="row"' if index == 0 else "td"
            cells.append(f'<{tag} data-key="{escape(column.key)}">{text}</{tag.split()[0]}>')
        return "<tr>" + "".join(cells) + "</tr>"

    def export_json(self) -> str:
        """The raw rows as strict JSON (infinities and NaN become null)."""
        return json.dumps([{k: _finite(v) for k, v in row.items()} for row in self.rows], indent=2)

    def export_csv(self) -> str:
        """The raw rows as CSV, one column per table column."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow([c.key for c in self.columns])
        for row in self.rows:
            writer.writerow(
                ["" if row.get(c.key) is None else _csv_cell(row.get(c.key)) for c in self.columns]
            )
        return out.getvalue()


def _finite(value: Any) -> Any:
    """None for a non-finite float (strict JSON), the value otherwise."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_cell(value: Any) -> str:
    """A CSV cell; a leading =, +, - or @ in text is quoted against spreadsheet formula injection."""
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    if isinstance(value, str) and text[:1] in ("=", "+", "-", "@"):
        return "'" + text
    return text
