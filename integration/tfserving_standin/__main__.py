"""``python integration/tfserving_standin/__main__.py --port=P --rest_api_port=R ...``: the
STAND-IN TF Serving server (runnable as a plain script, so the adapter can launch it)."""

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tfserving_standin._server import main
else:
    from ._server import main

if __name__ == "__main__":
    raise SystemExit(main())
