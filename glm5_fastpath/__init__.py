"""glm5_fastpath: fast GLM-5 decode (attention prefix + MegaMoE) on NVIDIA Hopper, as an SGLang plugin.

Importing the package is cheap: no CUDA, no kernels, no SGLang.
"""
__version__ = "0.1.0"

from .config import Glm5Config, ConfigError  # noqa: E402,F401
