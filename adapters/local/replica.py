"""Entry point of a replica process: ``python -m inferline.adapters.local.replica CONFIG_JSON``.

Kept apart from ``_server`` so that importing the package never imports this ``-m`` target.
"""

import sys

from ._server import main

if __name__ == "__main__":
    sys.exit(main())
