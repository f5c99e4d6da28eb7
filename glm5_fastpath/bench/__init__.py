"""Benchmark support shared by every benchmark: run metadata (GPU, date, commit), timing helpers later."""
