"""Import-only stand-in for torchvision.transforms: every attribute is a class that raises when used."""
from torchvision import _unavailable
from . import functional  # noqa: F401
from .functional import InterpolationMode  # noqa: F401


def __getattr__(name: str):
    return _unavailable.attribute(__name__, name)
