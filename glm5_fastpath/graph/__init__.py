"""The attention prefix as an explicit op graph (def-use, tiles) and its eager executor."""
from .eager import run_eager  # noqa: F401
from .op_graph import Edge, GraphError, OpDef, OpGraph, ShapeContext, TensorDef, Tile, write_coverage  # noqa: F401
from .prefix_graph import (  # noqa: F401
    INDEXER_OPS, PrefixTiling, build_prefix_graph, prefix_env, prefix_graph_for_layer, weight_tensors)
