"""Pieces of docs/gen_reference.py: one module per generated reference page, plus the shared helpers
(:mod:`refgen.md`: Markdown escaping and tables; :mod:`refgen.source`: comments and docstrings read
from the code)."""
