"""The one behaviour of every stub attribute: raise on use (see ../README.md)."""


def attribute(module: str, name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    class _Unavailable:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"{module}.{name} is a CPU-CI import stub (tests/integrations/sglang/cpu_stubs): "
                               "install a real torchvision to use it")

    _Unavailable.__name__ = _Unavailable.__qualname__ = name
    return _Unavailable
