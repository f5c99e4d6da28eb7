"""Test support shared by the test suite and the GPU check scripts (numerics, generators, the PDL late producer)."""
