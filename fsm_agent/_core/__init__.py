"""fsm_agent's bottom layer (trio's ``_core``): the spec language, its vocabulary and the engine.

It imports nothing else of fsm_agent; ``trace``, ``diagram`` and ``_readers`` read what it
makes, and ``fsm_agent/__init__.py`` re-exports its public names. docs/modules.md lists its
modules by layer.
"""
