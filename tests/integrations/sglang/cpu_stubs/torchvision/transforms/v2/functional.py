"""Import-only stand-in (see the cpu_stubs README): every attribute raises when used."""
from torchvision import _unavailable


def __getattr__(name: str):
    return _unavailable.attribute(__name__, name)
