"""The device step: `model_runner` (the only place that compiles, places and reads back; one
executable per bucket), `buckets` (every static shape) and `batch` (a scheduled step padded
to its bucket, on the host).
"""
