"""Pure-PyTorch reference math of one GLM-5 decode layer (CPU and CUDA)."""
