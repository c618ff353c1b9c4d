"""Bench's judgements: percentiles, the comparison and its verdict, acceptance from /metrics."""
