"""report.md as one self-contained HTML page (report.html): MLflow's artifact viewer shows HTML, not markdown, and a
page whose figures are embedded (data URIs) shows them there, where relative image links inside the store's
artifacts would be dead. Only what the report's markdown holds is rendered: headings, tables, images, paragraphs."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:110em}table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #ccc;padding:.2em .5em;font-size:90%}th{background:#f3f3f3}img{max-width:100%}")


def _image(match: re.Match, directory: Path) -> str:
    alt, name = match.groups()
    path = directory / name
    if not path.is_file():
        return html.escape(match.group(0))
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _cells(line: str) -> list[str]:
    return [html.escape(cell.strip()) for cell in line.strip().strip("|").split("|")]


def markdown_to_html(markdown: str, directory: Path, title: str) -> str:
    out, table = [], []

    def close_table() -> None:
        if table:
            header, rows = table[0], table[2:]  # the second line is the header's rule
            out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in _cells(header)) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in _cells(r)) + "</tr>" for r in rows)
                       + "</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        close_table()
        heading = re.match(r"(#{1,4}) (.*)", line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{html.escape(heading.group(2))}</h{level}>")
        elif IMAGE.search(line):
            out.append(IMAGE.sub(lambda m: _image(m, directory), line))
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    close_table()
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n")
