"""State diagrams of a spec, optionally with the path a recorded trace took::

    from fsm_agent import load_spec
    from fsm_agent.diagram import render

    text = render(load_spec("torchrun"), "mermaid")   # str (also "dot")
    svg = render(load_spec("torchrun"), "svg")        # bytes (also "png"): needs the diagrams
                                                      # extra, else DiagramEngineMissing

``highlight_from_replay(fsm_agent.trace.replay(spec, trace))`` gives the ``highlight`` that draws
a run's path with edge counts (what ``fsm-agent diagram --trace`` does), and the parameters the
run used; ``render(spec, fmt, params={"backoff_max": "90s"})`` draws other values as in force.
Notation and formats: docs/diagrams.md. Importing this module does not import torch or Graphviz.
"""

from __future__ import annotations

from ._render import (
    EXTENSIONS,
    FORMATS,
    DiagramEngineMissing,
    Highlight,
    highlight_from_replay,
    render,
    to_dot,
    to_mermaid,
)

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "DiagramEngineMissing",
    "Highlight",
    "highlight_from_replay",
    "render",
    "to_dot",
    "to_mermaid",
]
