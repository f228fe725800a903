"""The ``inferline`` command line: one module per verb (``inferline.cli.plan``, ...).

``main`` is the console entry point (``inferline = "inferline.cli:main"``); ``VERBS`` lists the
verb modules; ``_args`` and the other ``_*_args`` modules hold the options several verbs share.
"""

from inferline.cli._main import VERBS, build_parser, main

__all__ = ["VERBS", "build_parser", "main"]
