"""Import-only stand-in for torchvision on CPU CI (see ../README.md). Any use raises."""
__version__ = "0.0.0+glm5-fastpath-cpu-stub"
