"""Import-only stand-in for torchvision.transforms.functional (see ../../README.md)."""
import enum

from torchvision import _unavailable


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name: str):
    return _unavailable.attribute(__name__, name)
