"""Test harness for a real Triton Inference Server (from the nvidia-pytriton wheel).

Kept out of the installed package: used by ``integration/test_triton*.py`` and
``benchmarks/triton_overhead.py``. The folder is not called ``triton`` so that it never
shadows OpenAI's ``triton`` package when ``integration/`` is on ``sys.path`` under pytest.
"""

from .models import MODELS, Digits, build_repository, load_digits_split, write_sleep_model
from .server import TritonServer, free_port
from .setup_server import Install, SetupError, ensure_installed, repo_root

__all__ = [
    "MODELS",
    "Digits",
    "Install",
    "SetupError",
    "TritonServer",
    "build_repository",
    "ensure_installed",
    "free_port",
    "load_digits_split",
    "repo_root",
    "write_sleep_model",
]
