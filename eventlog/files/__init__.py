"""Data files: Parquet reads and writes, statistics, schemas and partition values,
deletion vectors, reading live rows, and pruning files by partition values and statistics.
"""
