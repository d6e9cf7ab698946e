"""Headless Chromium for the report tests: the page's DOM after rendering, and a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

__all__ = ["Element", "chromium", "dom", "screenshot"]

# No network, no GPU, no first-run chatter; --no-sandbox because the suite runs as root in CI.
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
          "--no-first-run", "--hide-scrollbars", "--proxy-server=127.0.0.1:9",
          "--host-resolver-rules=MAP * ~NOTFOUND"]


def chromium() -> str:
    """The browser binary (Debian's ``chromium``); skips the test when it is missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install chromium)")


def _run(args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium(), *_FLAGS, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def screenshot(page: Path, out: Path, size: tuple[int, int] = (1280, 2000)) -> Path:
    """Render ``page`` and save a PNG of it."""
    proc = _run([f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", page.as_uri()])
    assert out.is_file() and out.stat().st_size > 10_000, proc.stderr[-2000:]
    return out


class Element:
    """One element of the rendered DOM: tag, attributes, text inside and children."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag = tag
        self.attrs = attrs
        self.parent = parent
        self.children: list[Element] = []
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return " ".join("".join(self._texts()).split())

    def _texts(self) -> list[str]:
        out = list(self.parts)
        for c in self.children:
            out.extend(c._texts())
        return out

    def iter(self) -> list[Element]:
        out = [self]
        for c in self.children:
            out.extend(c.iter())
        return out

    def find_all(self, tag: str | None = None, *, cls: str | None = None,
                 id: str | None = None) -> list[Element]:
        return [e for e in self.iter()
                if (tag is None or e.tag == tag)
                and (cls is None or cls in e.attrs.get("class", "").split())
                and (id is None or e.attrs.get("id") == id)]

    def one(self, tag: str | None = None, **kw: str) -> Element:
        found = self.find_all(tag, **kw)
        assert len(found) == 1, (tag, kw, len(found))
        return found[0]


_VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "wbr", "source"}


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(el)
        if tag not in _VOID:
            self.cur = el

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        node: Element | None = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data: str) -> None:
        self.cur.parts.append(data)


def dom(page: Path) -> Element:
    """The DOM Chromium built from ``page`` (after parsing and layout), as a tree."""
    proc = _run(["--dump-dom", page.as_uri()])
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    b = _Builder()
    b.feed(proc.stdout)
    return b.root
